"""L1: tiny configs build every component; the graphs pass onnx.checker (full) and shape
inference, the contract validates against them, and onnxruntime (CPU) runs them with random
weights bound directly to the initializers, giving logits/present of the contract's shapes."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from mobius.contract import validate
from mobius.records import BuildOptions
from mobius_gemma4.build import build_component
from mobius_gemma4.config import read_config
from mobius_gemma4.contract import pipeline_contract, text_components

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.l1

TEXT = {
    "model_type": "gemma4_text",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "global_head_dim": 16,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    "sliding_window": 4,
    "hidden_size_per_layer_input": 4,
    "vocab_size_per_layer_input": 128,
    "num_kv_shared_layers": 2,
    "use_double_wide_mlp": True,
    "final_logit_softcapping": 3.0,
    "max_position_embeddings": 256,
}
MOE = {
    "model_type": "gemma4_text",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 40,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "global_head_dim": 16,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "sliding_window": 4,
    "hidden_size_per_layer_input": 0,
    "enable_moe_block": True,
    "num_experts": 4,
    "top_k_experts": 2,
    "moe_intermediate_size": 24,
    "final_logit_softcapping": 30.0,
}
MM = {
    "model_type": "gemma4",
    "text_config": {**TEXT, "model_type": "gemma4_text"},
    "image_token_id": 120,
    "video_token_id": 121,
    "audio_token_id": 122,
}
CASES = {"text": TEXT, "moe": MOE, "mm": MM}

NP = {ir.DataType.FLOAT: np.float32, ir.DataType.FLOAT16: np.float16}


def _bind_random(model: ir.Model, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for value in model.graph.initializers.values():
        if value.const_value is None:
            shape = [int(d) for d in value.shape]
            data = rng.normal(0.0, 0.1, shape)
            if value.name.endswith(("layernorm.weight", "norm.weight", "layer_scalar", "scale")):
                data += 1.0
            value.const_value = ir.tensor(data.astype(NP[value.dtype]), name=value.name)


def _build(case: str, dtype: str = "f32", target: str = "default", logits: str = "all"):
    raw = CASES[case]
    config = read_config(raw["model_type"], raw)
    options = BuildOptions(dtype=dtype, target=target, logits=logits)
    graphs = {c: build_component(config, c, options) for c in text_components(config, options)}
    return config, pipeline_contract(config, options), graphs


@pytest.mark.parametrize("target", ["default", "cpu"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_builds_check_and_validate(case, dtype, target):
    config, contract, graphs = _build(case, dtype, target)
    validate(contract, graphs)
    text = config.text
    assert len(contract.states) == 2 * text.num_cache_layers
    for name, model in graphs.items():
        _bind_random(model)
        proto = ir.serde.serialize_model(model)
        onnx.checker.check_model(proto, full_check=True)
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
        past = [i.name for i in proto.graph.input if i.name.startswith("past_key_values.")]
        if name in ("model", "decoder"):
            assert len(past) == 2 * (text.num_hidden_layers - text.num_kv_shared_layers)


def _session(model: ir.Model):
    _bind_random(model)
    return ort.InferenceSession(
        ir.serde.serialize_model(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )


def _ops(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


@pytest.mark.parametrize(
    ("target", "dtype", "expect"),
    [
        ("default", "f32", "Attention"),
        ("cpu", "f32", "GroupQueryAttention"),
        ("cpu", "f16", "GroupQueryAttention"),
        ("cpu", "bf16", "Attention"),  # onnxruntime CPU has no bfloat16 GQA kernel
        ("cuda", "f32", "Attention"),  # onnxruntime CUDA GQA: float16 / bfloat16 only
        ("cuda", "f16", "GroupQueryAttention"),
        ("cuda", "bf16", "GroupQueryAttention"),
    ],
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_target_picks_attention_op_per_layer(case, target, dtype, expect):
    """Every layer (KV consumers included) uses the op the target/dtype allows, never a mix."""
    config, _, graphs = _build(case, dtype, target)
    ops = _ops(graphs["model" if "model" in graphs else "decoder"])
    assert ops.count(expect) == config.text.num_hidden_layers
    other = {"Attention": "GroupQueryAttention", "GroupQueryAttention": "Attention"}[expect]
    assert ops.count(other) == 0


def test_vision_overlay_keeps_sliding_layers_on_attention():
    """With the image-block overlay only full layers (causal in HF) may use GQA."""
    from mobius.lm.decoder import ATTENTION, GQA
    from mobius_gemma4.text.model import attention_paths

    config = read_config(MM["model_type"], MM)
    text = config.text
    paths = attention_paths(text, "cpu", ir.DataType.FLOAT, overlay=True)
    for t, path in zip(text.layer_types, paths):
        assert path == (GQA if t == "full_attention" else ATTENTION)
    assert attention_paths(text, "default", ir.DataType.FLOAT) == (ATTENTION,) * len(paths)


def _random_feeds(text, B, S):
    ids = np.random.default_rng(1).integers(0, text.vocab_size, (B, S))
    past = {
        f"past_key_values.{i}.{k}": np.zeros(
            (B, text.kv_heads[i], 0, text.head_dims[i]), np.float32
        )
        for i in range(text.num_cache_layers)
        for k in ("key", "value")
    }
    return ids, past


@pytest.mark.parametrize("case", ["text", "moe"])
def test_gqa_graph_equals_attention_graph(case):
    """cpu (GroupQueryAttention) and default (Attention) graphs agree on the same weights.

    Prefill of 7 tokens (window 4) then 3 decode steps, batch 2; presents included.
    """
    config, _, base = _build(case, "f32", "default")
    _, _, gqa = _build(case, "f32", "cpu")
    text = config.text
    runs = []
    for graphs in (base, gqa):
        sess = _session(graphs["model"])  # same seed: the same random weights
        names = [o.name for o in sess.get_outputs()]
        ids, past = _random_feeds(text, 2, 7)
        outs, total, step_ids = [], 0, ids
        for extra in range(4):
            total += step_ids.shape[1]
            feeds = {
                "input_ids": step_ids,
                "attention_mask": np.ones((2, total), np.int64),
                "position_ids": np.tile(np.arange(total - step_ids.shape[1], total), (2, 1)),
                **past,
            }
            out = dict(zip(names, sess.run(None, feeds)))
            outs.append(out)
            past = {
                k.replace("present.", "past_key_values."): v
                for k, v in out.items()
                if k.startswith("present.")
            }
            step_ids = ids[:, extra : extra + 1]
        runs.append(outs)
    for a, b in zip(*runs):
        for name in a:
            assert a[name].shape == b[name].shape, name
            assert np.abs(a[name] - b[name]).max() <= 1e-5, name


@pytest.mark.parametrize("target", ["default", "cpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_runs_in_onnxruntime_with_prefill_and_decode(case, target):
    config, _, graphs = _build(case, target=target)
    text = config.text
    sessions = {name: _session(m) for name, m in graphs.items()}
    B, S = 2, 7  # longer than the window (4)
    ids = np.random.default_rng(1).integers(0, text.vocab_size, (B, S))
    past = {
        f"past_key_values.{i}.{k}": np.zeros(
            (B, text.kv_heads[i], 0, text.head_dims[i]), np.float32
        )
        for i in range(text.num_cache_layers)
        for k in ("key", "value")
    }

    def step(step_ids, total, past):
        feeds = {
            "attention_mask": np.ones((B, total), np.int64),
            "position_ids": np.tile(np.arange(total - step_ids.shape[1], total), (B, 1)),
            **past,
        }
        if "model" in sessions:
            sess, feeds["input_ids"] = sessions["model"], step_ids
        else:
            emb = sessions["embedding"]
            feeds.update(
                zip([o.name for o in emb.get_outputs()], emb.run(None, {"input_ids": step_ids}))
            )
            sess = sessions["decoder"]
        return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))

    out = step(ids, S, past)
    assert out["logits"].shape == (B, S, text.vocab_size)
    assert np.isfinite(out["logits"]).all()
    cap = text.final_logit_softcapping
    assert np.abs(out["logits"]).max() <= cap
    presents = {k: v for k, v in out.items() if k.startswith("present.")}
    assert len(presents) == 2 * text.num_cache_layers
    for i in range(text.num_cache_layers):
        assert presents[f"present.{i}.key"].shape == (B, text.kv_heads[i], S, text.head_dims[i])
    past = {k.replace("present.", "past_key_values."): v for k, v in presents.items()}
    out2 = step(ids[:, -1:], S + 1, past)
    assert out2["logits"].shape == (B, 1, text.vocab_size)
    assert out2["present.0.value"].shape[2] == S + 1


@pytest.mark.parametrize("target", ["default", "cpu"])
@pytest.mark.parametrize("case", ["text", "mm"])
def test_last_position_logits_are_the_last_row_of_all(case, target):
    """``logits="last"``: the contract and graph give ``[B, 1, V]``, equal to the last row of
    the ``"all"`` build's logits on the same weights, and the same presents (prefill of 7)."""
    runs = {}
    for logits in ("all", "last"):
        config, contract, graphs = _build(case, target=target, logits=logits)
        validate(contract, graphs)
        text = config.text
        comp = "model" if "model" in graphs else "decoder"
        declared = next(p for p in contract.component(comp).outputs if p.name == "logits")
        assert declared.shape[1] == (1 if logits == "last" else "sequence_len")
        sessions = {name: _session(m) for name, m in graphs.items()}  # same seed per graph
        ids, past = _random_feeds(text, 2, 7)
        feeds = {
            "attention_mask": np.ones((2, 7), np.int64),
            "position_ids": np.tile(np.arange(7), (2, 1)),
            **past,
        }
        if comp == "model":
            feeds["input_ids"] = ids
        else:
            emb = sessions["embedding"]
            feeds.update(
                zip([o.name for o in emb.get_outputs()], emb.run(None, {"input_ids": ids}))
            )
        sess = sessions[comp]
        runs[logits] = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert runs["last"]["logits"].shape == (2, 1, config.text.vocab_size)
    np.testing.assert_array_equal(runs["last"]["logits"], runs["all"]["logits"][:, -1:])
    for name, value in runs["all"].items():
        if name != "logits":
            np.testing.assert_array_equal(runs["last"][name], value)
