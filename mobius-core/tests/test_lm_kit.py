"""mobius.lm, the decoder-LM family kit: config readers, ports / contract, graph, plans.

The numerics of the decoder are checked against HF by the families built on it
(mobius-qwen3, mobius-llama L3 parity); these tests pin the kit's own rules.
"""

from __future__ import annotations

import json
import logging

import pytest

from mobius.contract import validate
from mobius.errors import BuildError, ConfigError, WeightPlanError
from mobius.lm.config import FULL, SLIDING, DecoderConfig, read_decoder, read_layer_types
from mobius.lm.ports import LMShape, kv_port, lm_contract, lm_ports
from mobius.lm.runtime import check_component, genai_config, stop_ids

DEFAULTS = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def _cfg(raw: dict | None = None, window: int | None = None, **kw) -> DecoderConfig:
    raw = dict(raw or {})
    fields = read_decoder("toy", raw, "config.json", family="Toy", defaults=DEFAULTS, **kw)
    n = fields["num_hidden_layers"]
    kinds = read_layer_types(raw, n, window, "config.json", default=[SLIDING] * n)
    return DecoderConfig(**fields, layer_types=kinds, sliding_window=window)


def test_kv_port_is_the_one_spelling():
    assert kv_port(3, "key") == "past_key_values.3.key"
    assert kv_port(0, "value", present=True) == "present.0.value"


def test_shared_layers_have_no_kv_ports():
    shape = LMShape(10, (2, 2, 4), (8, 8, 16), shared=frozenset({1}))
    ins, outs = lm_ports(shape, "float16")
    names = [n for n, _, _ in ins]
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert names[3:] == [kv_port(i, k) for i in (0, 2) for k in ("key", "value")]
    assert ("present.2.key", "float16", ("batch", 4, "total_sequence_len", 16)) in outs
    contract = lm_contract(shape, "float16")
    assert [s.initial_shape for s in contract.states][-1] == ("batch", 4, 0, 16)
    assert contract.outputs == ("model.logits",)


def test_read_decoder_defaults_and_biases():
    cfg = _cfg({"attention_bias": True, "mlp_bias": True, "head_dim": None})
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.hidden_act) == (8, 4, "silu")
    assert cfg.attention_bias and cfg.mlp_bias
    # a family whose HF class has no MLP bias ignores the key, as HF does
    assert not _cfg({"mlp_bias": True}, bias_keys=("attention_bias",)).mlp_bias
    assert _cfg({"eos_token_id": [2, 3]}).eos_token_id == (2, 3)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"num_key_value_heads": 3}, "multiple"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "sequence length"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"head_dim": 7}, "odd"),
        ({"layer_types": [FULL]}, "2 layers"),
        ({"layer_types": [FULL, "chunked_attention"]}, "unknown layer type"),
    ],
)
def test_bad_values_are_config_errors(raw, words):
    with pytest.raises(ConfigError) as err:
        _cfg(raw, window=4)
    assert words in f"{err.value} {err.value.where}" and err.value.fix


def test_rope_shapes_and_windows():
    hub = _cfg({"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}})
    saved = _cfg({"rope_parameters": {"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}})
    assert hub.rope == saved.rope and hub.rope.factor == 2.0
    assert _cfg(window=4).window(1) == 4 and _cfg().window(1) is None
    assert _cfg().layer_types == (FULL, FULL)  # no window: nothing slides


def test_stop_ids_and_genai_section():
    cfg = _cfg({"eos_token_id": 2, "bos_token_id": 1})
    assert stop_ids(cfg, [5, 2], 9) == (2, 5, 9)
    genai = genai_config(cfg, "llama", (2, 5))
    assert genai["model"]["type"] == "llama" and genai["model"]["eos_token_id"] == [2, 5]
    assert genai["model"]["decoder"]["head_size"] == 8
    json.dumps(genai)


def test_check_component_names_the_fix():
    with pytest.raises(BuildError) as err:
        check_component(_cfg(), "vision", "here", "Toy")
    assert "vision" in str(err.value) and "'model'" in err.value.fix


@pytest.mark.parametrize("target", ["default", "cpu"])
def test_decoder_graph_meets_its_contract(target, caplog):
    from mobius.lm.decoder import build_decoder, decoder_shape

    cfg = _cfg({"attention_bias": True, "mlp_bias": True}, window=4)
    with caplog.at_level(logging.INFO, logger="mobius.lm"):
        model = build_decoder(cfg, "f32", target, family="toy", qk_norm=True)
    path = "GroupQueryAttention" if target == "cpu" else "Attention"
    assert f"toy target {target}: {path} on all 2 layers" in caplog.text
    validate(lm_contract(decoder_shape(cfg), "float32"), {"model": model})
    ops = [n.op_type for n in model.graph]
    assert ops.count(path) == 2
    names = set(model.graph.initializers)
    assert "layers.1.mlp.down_proj.bias" in names and "layers.0.self_attn.q_norm.weight" in names
    assert "lm_head.weight" in names


@pytest.mark.parametrize("target", ["default", "cpu"])
def test_last_position_logits_meet_their_contract(target):
    """``logits="last"``: the head runs on one position; the graph declares
    ``[batch, 1, vocab]`` and meets that contract."""
    from mobius.lm.decoder import build_decoder, decoder_shape

    cfg = _cfg()
    model = build_decoder(cfg, "f32", target, family="toy", logits="last")
    shape = decoder_shape(cfg)
    validate(lm_contract(shape, "float32", logits="last"), {"model": model})
    logits = next(p for p in lm_contract(shape, "float32", logits="last").components[0].outputs)
    assert logits.name == "logits" and logits.shape == ("batch", 1, 64)
    out = next(v for v in model.graph.outputs if v.name == "logits")
    assert out.shape[1] == 1 and out.shape[2] == 64


def test_bf16_cpu_keeps_attention_and_says_why(caplog):
    from mobius.lm.decoder import attention_path

    with caplog.at_level(logging.INFO, logger="mobius.lm"):
        assert attention_path("cpu", "bfloat16", family="toy", layers=3) == "Attention"
    assert "no GroupQueryAttention kernel" in caplog.text


def test_decoder_plan_matches_the_graph(tmp_path):
    from types import SimpleNamespace

    from mobius.lm.decoder import build_decoder
    from mobius.lm.weights import decoder_plan

    cfg = _cfg({"tie_word_embeddings": True, "mlp_bias": True})
    model = build_decoder(cfg, "f32", family="toy")
    wanted = {n for n, v in model.graph.initializers.items() if v.const_value is None}
    # the plan reads only which tensors the checkpoint has (and its root, for errors)
    names = {f"model.{n}" for n in wanted} | {"lm_head.weight"}
    plan = decoder_plan(cfg, SimpleNamespace(tensors=names, root=tmp_path), "float32")
    assert set(plan.entries) == wanted and "lm_head.weight" in plan.ignored
    untied = _cfg({"tie_word_embeddings": False})
    headless = SimpleNamespace(tensors=names - {"lm_head.weight"}, root=tmp_path)
    with pytest.raises(WeightPlanError, match=r"no lm_head\.weight"):
        decoder_plan(untied, headless, "float32")


def test_a_decoder_family_object_is_a_plugin(tmp_path):
    """DecoderFamily registers through the host like a module of hooks, and a build of a
    numpy checkpoint through it meets its contract (no other family code)."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import numpy as np

    import mobius
    from mobius.lm.family import DecoderFamily
    from mobius.plugins import PluginHost
    from mobius.records import ModelTypeInfo

    def read(model_type, raw):
        return _cfg(raw)

    family = DecoderFamily("Toy", [ModelTypeInfo("toy", tasks=("text-generation",))], read)
    host = PluginHost.from_plugins({"toy": family}, builtins=True)
    assert host.owner("toy") == "toy"
    record = next(r for r in host.records() if r.name == "toy")
    assert record.status == "ok" and record.model_types == ("toy",)
    cfg = _cfg()
    rng = np.random.default_rng(0)
    from mobius.lm.decoder import build_decoder

    model = build_decoder(cfg, "f32", family="toy")
    tensors = {}
    for name, value in model.graph.initializers.items():
        if value.const_value is None:
            shape = [int(d) for d in value.shape]
            if name.endswith("_proj.weight"):  # HF stores [out, in]
                shape = shape[::-1]
            tensors[f"model.{name}"] = rng.standard_normal(shape).astype(np.float32)
    tensors["lm_head.weight"] = rng.standard_normal((64, 32)).astype(np.float32)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    safetensors_numpy.save_file(tensors, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(json.dumps({"model_type": "toy", "eos_token_id": 2}))
    result = mobius.build(str(ckpt), str(tmp_path / "pkg"), host=host)
    genai = json.loads((result.out / "genai_config.json").read_text())
    assert genai["model"]["type"] == "toy" and genai["model"]["eos_token_id"] == 2
