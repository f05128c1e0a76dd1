"""The bundled testdata/tiny-gemma4 checkpoint: self-consistent, builds, and matches HF.

The consistency checks need only json + tokenizers; the build/parity check is an
L3 reference test (torch + transformers).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"


def _json(name: str) -> dict:
    return json.loads((TINY / name).read_text(encoding="utf-8"))


@pytest.mark.l1
def test_bundled_checkpoint_is_small_and_complete():
    names = {p.name for p in TINY.iterdir()}
    need = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    assert need | {"tokenizer_config.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in TINY.iterdir()) <= 3 * 1024 * 1024


@pytest.mark.l1
def test_bundled_tokenizer_matches_config():
    """Vocab size and special-token ids agree across tokenizer and the three configs."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    cfg, gen, tcfg = (
        _json("config.json"),
        _json("generation_config.json"),
        _json("tokenizer_config.json"),
    )
    assert tok.get_vocab_size(with_added_tokens=True) == cfg["vocab_size"]
    assert tok.token_to_id(tcfg["bos_token"]) == cfg["bos_token_id"] == gen["bos_token_id"]
    assert tok.token_to_id(tcfg["pad_token"]) == cfg["pad_token_id"] == gen["pad_token_id"]
    eos = [tok.token_to_id(t) for t in (tcfg["eos_token"], "<turn|>")]
    assert eos == cfg["eos_token_id"] == gen["eos_token_id"]
    ids = tok.encode("<bos><|turn>user\nhello<turn|>\n").ids
    assert ids[:2] == [cfg["bos_token_id"], tok.token_to_id("<|turn>")]
    assert tok.decode(tok.encode("It was the best of times.").ids) == "It was the best of times."


@pytest.mark.l3
@pytest.mark.reference
def test_bundled_checkpoint_builds_and_matches_hf(mobius_build, hf_reference):
    """f32 package of the bundled checkpoint vs HF over a 32-token prefill + 8 decode steps.

    Built by the harness (``mobius_build``, cached per session, shared with the tiny L4/L5
    cases), the HF model from ``hf_reference``; the package runs through
    ``mobius_runtime.Pipeline.step`` (reference/run.py).
    """
    pytest.importorskip("onnxruntime")
    from reference.hf_runner import hf_logits
    from reference.run import load_pipeline, step_logits

    ids = np.random.default_rng(7).integers(7, 512, size=(1, 40), dtype=np.int64)
    ref = hf_logits(hf_reference(TINY).model, ids)
    got, _ = step_logits(load_pipeline(mobius_build(TINY, dtype="f32")), ids, 32)
    delta = float(np.abs(ref - got).max())
    print(f"\n[L3] testdata/tiny-gemma4 f32: max|Δ| {delta:.3e}")
    assert delta <= 1e-4
    assert (ref.argmax(-1) == got.argmax(-1)).all()
