"""Build, run, chat and quantize a Gemma 3 text package with no family code outside the plugin.

The checkpoint is written here with numpy (no torch): random weights under HF's names
(tied head: no ``lm_head.weight``), and the tokenizer files of ``testdata/tiny-qwen3`` (a
ChatML template: the plugin never reads it, core copies it and the runtime renders it).
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
GEN_EOS = [1, 106]
"""generation_config.json's eos ids (config.json says 1 only), as Gemma 3 -it ships."""
NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


def _checkpoint(folder, **extra):
    raw = {
        "model_type": "gemma3_text",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "max_position_embeddings": 128,
        "sliding_window": 4,
        "sliding_window_pattern": 3,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        **extra,
    }
    rng = np.random.default_rng(5)
    H, inter, hd = 32, 48, 16

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    t = {"model.embed_tokens.weight": w(VOCAB, H), "model.norm.weight": w(H)}
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n, (o, k) in {"q": (4 * hd, H), "k": (hd, H), "v": (hd, H), "o": (H, 4 * hd)}.items():
            t[p + f"self_attn.{n}_proj.weight"] = w(o, k)
        t[p + "self_attn.q_norm.weight"], t[p + "self_attn.k_norm.weight"] = w(hd), w(hd)
        t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = w(inter, H), w(inter, H)
        t[p + "mlp.down_proj.weight"] = w(H, inter)
        for n in NORMS:
            t[p + f"{n}.weight"] = w(H)
    folder.mkdir()
    safetensors_numpy.save_file(t, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(raw))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": GEN_EOS}))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(TOKENIZER / name, folder / name)
    return folder


@pytest.mark.l2
@pytest.mark.parametrize("target", ["default", "cpu"])
def test_builds_runs_and_chats(tmp_path, target):
    import mobius
    from mobius_runtime import Pipeline

    ckpt = _checkpoint(tmp_path / "ckpt", final_logit_softcapping=30.0)
    package = mobius.build(str(ckpt), str(tmp_path / "pkg"), target=target).out
    names = {p.name for p in package.iterdir()}
    assert {"genai_config.json", "tokenizer.json", "chat_template.jinja"} <= names
    genai = json.loads((package / "genai_config.json").read_text())
    assert genai["model"]["type"] == "gemma3_text"
    assert genai["model"]["eos_token_id"] == GEN_EOS
    assert genai["model"]["decoder"]["num_key_value_heads"] == 1
    pipeline = Pipeline.load(package, device="cpu")
    assert pipeline.text.processors.stop_token_ids == tuple(GEN_EOS)
    messages = [{"role": "user", "content": "We hold"}]
    assert pipeline.apply_chat_template(messages).startswith("<|im_start|>user\nWe hold")
    result = pipeline.generate(messages=messages, max_new_tokens=6)
    assert 1 <= len(result.ids) <= 6
    again = Pipeline.load(package, device="cpu").generate(messages=messages, max_new_tokens=6)
    assert again.ids == result.ids  # greedy: deterministic


@pytest.mark.l2
@pytest.mark.parametrize("target", ["default", "cpu"])
def test_last_position_logits_are_the_last_row(tmp_path, target):
    """``--logits last`` (the head on the last position only): its logits are the last row
    of the every-position package's, bit for bit, and greedy ids are the same."""
    import mobius
    from mobius_runtime import Pipeline

    ckpt = _checkpoint(tmp_path / "ckpt", final_logit_softcapping=30.0)
    every, last = (
        Pipeline.load(
            mobius.build(str(ckpt), str(tmp_path / k), target=target, logits=k).out, device="cpu"
        )
        for k in ("all", "last")
    )
    ids = np.array([[2, *range(40, 51)]], dtype=np.int64)
    full, one = every.forward(input_ids=ids)["logits"], last.forward(input_ids=ids)["logits"]
    assert full.shape == (1, 12, VOCAB) and one.shape == (1, 1, VOCAB)
    np.testing.assert_array_equal(one[:, 0], full[:, -1])
    kw = {"input_ids": ids, "max_new_tokens": 12, "stop_ids": ()}
    assert last.generate(**kw).ids == every.generate(**kw).ids


@pytest.mark.l2
def test_cli_run_and_chat(tmp_path):
    """``mobius run`` / ``mobius chat`` (the installed console script) on the built package."""
    import subprocess
    import sys
    from pathlib import Path

    import mobius

    package = mobius.build(str(_checkpoint(tmp_path / "ckpt")), str(tmp_path / "pkg")).out
    cli = str(Path(sys.executable).with_name("mobius"))
    args = ["--max-new-tokens", "4", "--device", "cpu"]
    ran = subprocess.run(
        [cli, "run", str(package), "-p", "We hold", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    assert 1 <= len(json.loads(ran.stdout)["ids"]) <= 4
    chat = subprocess.run(
        [cli, "chat", str(package), *args],
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert chat.returncode == 0, chat.stderr  # a reply per line read, then EOF ends it


@pytest.mark.l2
@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_quant_needs_no_plugin_code(tmp_path, quant):
    """``--quant`` is core's rewrite: every projection of every layer (4 attention, 3 MLP)
    becomes MatMulNBits, and the package still runs."""
    import onnx

    import mobius
    from mobius_runtime import Pipeline

    ckpt = _checkpoint(tmp_path / "ckpt")
    package = mobius.build(str(ckpt), str(tmp_path / quant), quant=quant).out
    graph = onnx.load(str(package / "model" / "model.onnx"), load_external_data=False).graph
    nbits = sum(node.op_type == "MatMulNBits" for node in graph.node)
    assert nbits >= 7 * 3
    ids = Pipeline.load(package, device="cpu").generate(input_ids=[5, 6, 7], max_new_tokens=4).ids
    assert len(ids) >= 1


def test_a_second_component_is_a_build_error():
    from mobius.errors import BuildError
    from mobius.records import BuildOptions
    from mobius_gemma3.plugin import FAMILY

    cfg = FAMILY.mobius_read_config("gemma3_text", {"num_hidden_layers": 1})
    with pytest.raises(BuildError) as err:
        FAMILY.mobius_build_component(cfg, "vision_encoder", BuildOptions())
    assert "vision_encoder" in str(err.value) and err.value.fix
