"""L3 synthetic parity of Llama / Mistral: mobius packages on ORT CPU vs HF transformers 5.24.

Each tiny seeded checkpoint of ``llama_specs.py`` is built with ``mobius.build`` and run
through ``mobius_runtime.Pipeline`` (checks: :mod:`mobius_testing.lm_parity`): a 24-token
prefill and 16 cached single-token steps against one HF float32 no-cache forward; f32
max|Δ logits| ≤ 1e-4 and 100 % top-1 on every target; 16 greedy ids equal HF
``generate``'s; f16 tie-aware top-1 100 %; both config shapes build identically.
Figures are printed (``-s``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from llama_specs import SPECS

from mobius_testing import lm_parity as lp

pytestmark = [pytest.mark.reference, pytest.mark.l3]

TARGETS = ["default", "cpu", "cuda"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_f32_parity(reference_cache, parity_ids, name, target):
    lp.assert_f32_parity(reference_cache, parity_ids, name, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_greedy_16_steps(reference_cache, parity_ids, name, target):
    lp.assert_greedy(reference_cache, parity_ids, name, target)


@pytest.mark.parametrize("target", ["default", "cpu"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_f16_top1(reference_cache, parity_ids, name, target):
    lp.assert_f16_top1(reference_cache, parity_ids, name, target)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_config_shapes_build_identically(reference_cache, parity_ids, name):
    lp.assert_shapes_identical(reference_cache, parity_ids, name)


def test_mistral_window_is_shorter_than_the_prompt():
    """The windowed spec must slide inside the prompt, or it tests nothing of the window."""
    assert SPECS["mistral-window"]["sliding_window"] < lp.PREFILL
