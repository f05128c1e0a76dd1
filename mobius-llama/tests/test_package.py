"""Build, run and quantize a Llama / Mistral package with no family code outside the plugin.

The checkpoint is written here with numpy (no torch): random weights under HF's names,
and the tokenizer files of ``testdata/tiny-qwen3`` (a ChatML template: the plugin never
reads it, core copies it and the runtime renders it).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import TESTDATA

pytest.importorskip("onnxruntime")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

TOKENIZER = TESTDATA / "tiny-qwen3"
VOCAB = 512
GEN_EOS = [2, 0]
"""generation_config.json's eos ids (config.json says 2 only)."""


def _checkpoint(folder, model_type: str, **extra):
    raw = {
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "bos_token_id": None,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "tie_word_embeddings": False,
        **extra,
    }
    rng = np.random.default_rng(5)
    H, inter, hd = 32, 48, 8

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    t = {"model.embed_tokens.weight": w(VOCAB, H), "model.norm.weight": 1 + w(H)}
    t["lm_head.weight"] = w(VOCAB, H)
    bias = raw.get("attention_bias", False)
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n, (o, k) in {
            "q": (4 * hd, H),
            "k": (2 * hd, H),
            "v": (2 * hd, H),
            "o": (H, 4 * hd),
        }.items():
            t[p + f"self_attn.{n}_proj.weight"] = w(o, k)
            if bias:
                t[p + f"self_attn.{n}_proj.bias"] = w(o)
        t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = w(inter, H), w(inter, H)
        t[p + "mlp.down_proj.weight"] = w(H, inter)
        t[p + "input_layernorm.weight"] = 1 + w(H)
        t[p + "post_attention_layernorm.weight"] = 1 + w(H)
    folder.mkdir()
    safetensors_numpy.save_file(t, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(raw))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": GEN_EOS}))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(TOKENIZER / name, folder / name)
    return folder


@pytest.mark.l2
@pytest.mark.parametrize(
    ("model_type", "extra", "target"),
    [
        ("llama", {"attention_bias": True}, "default"),
        ("llama", {}, "cpu"),
        ("mistral", {"sliding_window": 4}, "cpu"),
    ],
)
def test_builds_runs_and_chats(tmp_path, model_type, extra, target):
    import mobius
    from mobius_runtime import Pipeline

    ckpt = _checkpoint(tmp_path / "ckpt", model_type, **extra)
    package = mobius.build(str(ckpt), str(tmp_path / "pkg"), target=target).out
    names = {p.name for p in package.iterdir()}
    assert {"genai_config.json", "tokenizer.json", "chat_template.jinja"} <= names
    genai = json.loads((package / "genai_config.json").read_text())
    assert genai["model"]["type"] == model_type
    assert genai["model"]["eos_token_id"] == [2, 0]
    assert genai["model"]["decoder"]["num_key_value_heads"] == 2
    pipeline = Pipeline.load(package, device="cpu")
    assert pipeline.text.processors.stop_token_ids == (2, 0)
    messages = [{"role": "user", "content": "We hold"}]
    assert pipeline.apply_chat_template(messages).startswith("<|im_start|>user\nWe hold")
    result = pipeline.generate(messages=messages, max_new_tokens=6)
    assert 1 <= len(result.ids) <= 6
    again = Pipeline.load(package, device="cpu").generate(messages=messages, max_new_tokens=6)
    assert again.ids == result.ids  # greedy: deterministic


@pytest.mark.l2
@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_quant_needs_no_plugin_code(tmp_path, quant):
    """``--quant`` is core's rewrite: every projection of every layer (4 attention, 3 MLP)
    becomes MatMulNBits, and the package still runs."""
    import onnx

    import mobius
    from mobius_runtime import Pipeline

    ckpt = _checkpoint(tmp_path / "ckpt", "llama")
    package = mobius.build(str(ckpt), str(tmp_path / quant), quant=quant).out
    graph = onnx.load(str(package / "model" / "model.onnx"), load_external_data=False).graph
    nbits = sum(node.op_type == "MatMulNBits" for node in graph.node)
    assert nbits >= 7 * 2
    ids = Pipeline.load(package, device="cpu").generate(input_ids=[5, 6, 7], max_new_tokens=4).ids
    assert len(ids) >= 1


def test_a_second_component_is_a_build_error():
    from mobius.errors import BuildError
    from mobius.records import BuildOptions
    from mobius_llama.plugin import FAMILY

    cfg = FAMILY.mobius_read_config("llama", {"num_hidden_layers": 1})
    with pytest.raises(BuildError) as err:
        FAMILY.mobius_build_component(cfg, "vision_encoder", BuildOptions())
    assert "vision_encoder" in str(err.value) and err.value.fix


def test_measured_build_peak_is_the_builds_own_not_its_parents(tmp_path):
    """lm_parity.measured_build (the real-model tests' RSS bound) reports the build's own
    peak: a child's ru_maxrss carries the parent's high-water mark across exec, and a
    build started from a pytest holding HF's Gemma 3 once reported 1.8 GB that way."""
    from mobius_testing import lm_parity

    src = _checkpoint(tmp_path / "ckpt", "llama")
    ballast = np.ones(1 << 30, dtype=np.uint8)  # 1 GiB resident in this (parent) process
    try:
        done = lm_parity.measured_build(src, tmp_path / "pkg")
    finally:
        del ballast
    assert (done.out / "mobius.json").is_file()
    assert done.peak_rss < 768 * 2**20, f"{done.peak_rss / 2**20:.0f} MiB"
