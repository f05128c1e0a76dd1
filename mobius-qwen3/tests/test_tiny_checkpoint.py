"""The bundled testdata/tiny-qwen3 checkpoint: self-consistent, builds, runs, matches HF.

Consistency needs only json + tokenizers; the build and generation checks run the
package through the runtime; the HF comparison is an L3 reference test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TESTDATA

TINY = TESTDATA / "tiny-qwen3"


def _json(name: str) -> dict:
    return json.loads((TINY / name).read_text(encoding="utf-8"))


@pytest.mark.l1
def test_bundled_checkpoint_is_small_and_complete():
    names = {p.name for p in TINY.iterdir()}
    need = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    assert need | {"tokenizer_config.json", "chat_template.jinja", "README.md"} <= names
    assert sum(p.stat().st_size for p in TINY.iterdir()) <= 512 * 1024


@pytest.mark.l1
def test_bundled_tokenizer_matches_config():
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    cfg, gen, tcfg = (
        _json("config.json"),
        _json("generation_config.json"),
        _json("tokenizer_config.json"),
    )
    assert tok.get_vocab_size(with_added_tokens=True) == cfg["vocab_size"]
    assert tok.token_to_id(tcfg["eos_token"]) == cfg["eos_token_id"] == gen["eos_token_id"][0]
    assert tok.token_to_id(tcfg["pad_token"]) == cfg["pad_token_id"]
    from mobius_qwen3.processors import format_chat_prompt

    prompt = format_chat_prompt("hello")
    ids = tok.encode(prompt, add_special_tokens=False).ids
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert ids[0] == start and ids.count(start) == 2 and ids.count(end) == 1
    assert tok.decode(ids, skip_special_tokens=False) == prompt


@pytest.mark.l2
@pytest.mark.parametrize("target", ["default", "cpu"])
def test_bundled_builds_and_generates(mobius_build, target):
    """Built package carries genai_config, tokenizer files and (copied by core) the chat
    template; the runtime generates from chat messages through that template."""
    pytest.importorskip("onnxruntime")
    from mobius_runtime import Pipeline

    package = mobius_build(TINY, dtype="f32", target=target)
    names = {p.name for p in package.iterdir()}
    assert {"genai_config.json", "tokenizer.json", "chat_template.jinja"} <= names
    genai = json.loads((package / "genai_config.json").read_text())
    assert genai["model"]["type"] == "qwen3"
    assert genai["model"]["eos_token_id"] == [2, 0]
    pipeline = Pipeline.load(package, device="cpu")
    # generation_config.json's eos ids (2, 0) reach the runtime too, not only genai_config
    assert pipeline.text.processors.stop_token_ids == (2, 0)
    messages = [{"role": "user", "content": "We hold"}]
    result = pipeline.generate(messages=messages, max_new_tokens=8)
    assert 1 <= len(result.ids) <= 8
    assert result.prompt_ids[:1] == [1]  # <|im_start|>: the ChatML prompt, no BOS added
    from mobius_qwen3.processors import format_chat_prompt

    # the plugin's built-in layout (used without a template) is what the template renders
    assert pipeline.apply_chat_template(messages) == format_chat_prompt("We hold")


@pytest.mark.l3
@pytest.mark.reference
def test_bundled_checkpoint_matches_hf(mobius_build, hf_reference):
    """f32 package vs HF over a 32-token prefill + 8 cached decode steps."""
    pytest.importorskip("onnxruntime")
    from mobius_testing.lm_parity import hf_logits, load_pipeline, step_logits

    ids = np.random.default_rng(7).integers(6, 512, size=(1, 40), dtype=np.int64)
    ref = hf_logits(hf_reference(TINY).model, ids)
    got = step_logits(load_pipeline(mobius_build(TINY, dtype="f32")), ids, 32)
    delta = float(np.abs(ref - got).max())
    print(f"\n[L3] testdata/tiny-qwen3 f32: max|Δ| {delta:.3e}")
    assert delta <= 1e-4
    assert (ref.argmax(-1) == got.argmax(-1)).all()


@pytest.mark.l2
def test_int4_needs_no_plugin_code(tmp_path):
    """``--quant int4`` is core's rewrite: every projection of every layer (4 attention,
    3 MLP) becomes MatMulNBits, and the package still runs."""
    pytest.importorskip("onnxruntime")
    import onnx

    import mobius
    from mobius_runtime import Pipeline

    package = mobius.build(str(TINY), tmp_path / "int4", quant="int4").out
    graph = onnx.load(str(package / "model" / "model.onnx"), load_external_data=False).graph
    nbits = sum(node.op_type == "MatMulNBits" for node in graph.node)
    assert nbits >= 7 * _json("config.json")["num_hidden_layers"]
    ids = Pipeline.load(package, device="cpu").generate(input_ids=[5, 6, 7], max_new_tokens=4).ids
    assert len(ids) >= 1
