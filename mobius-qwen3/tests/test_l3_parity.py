"""L3 synthetic parity of Qwen3 / Qwen3-MoE: mobius packages on ORT CPU vs HF transformers 5.24.

Each tiny seeded checkpoint (qwen3_ref/specs.py: dense tied, dense untied with biases,
sliding layers and yarn RoPE, MoE with a dense layer) is built with ``mobius.build`` and
run through ``mobius_runtime.Pipeline`` (checks: :mod:`mobius_testing.lm_parity`): a
24-token prefill and 16 cached single-token steps, against one HF float32 no-cache
forward over the 40 tokens. Bars: f32 max|Δ logits| ≤ 1e-4 and 100 % top-1 on every
target; 16 greedy ids from ``Pipeline.generate`` equal HF ``generate``'s (HF's own KV
cache); f16 tie-aware top-1 100 % (a differing pick counts when its reference logit is
within 0.02 of the maximum, or, for MoE, when the position's reference routing has a
near-tie below ``ROUTE_TIE``: ties of a random tiny model that half precision cannot
resolve; at most 5 % of the positions may be excused as routing ties). Figures are
printed (``-s``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from mobius_testing import lm_parity as lp

pytestmark = [pytest.mark.reference, pytest.mark.l3]

SPECS = ["dense-tied", "dense-untied", "moe"]
TARGETS = ["default", "cpu", "cuda"]
ROUTE_TIE = 1e-3
"""A router margin (k-th minus (k+1)-th expert probability, HF float32) below this is a
routing near-tie for f16: float16 keeps ~3 decimal digits, so such a pick may flip."""


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", SPECS)
def test_f32_parity(reference_cache, parity_ids, name, target):
    lp.assert_f32_parity(reference_cache, parity_ids, name, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", SPECS)
def test_greedy_16_steps(reference_cache, parity_ids, name, target):
    lp.assert_greedy(reference_cache, parity_ids, name, target)


@pytest.mark.parametrize("target", ["default", "cpu"])
@pytest.mark.parametrize("name", SPECS)
def test_f16_top1(reference_cache, parity_ids, name, target):
    from qwen3_ref.hf_runner import route_margins

    top_k = reference_cache.specs[name].get("num_experts_per_tok", 1)
    margins = route_margins(reference_cache.model(name), parity_ids, top_k)
    ties = None if margins is None else margins[0] < ROUTE_TIE
    lp.assert_f16_top1(reference_cache, parity_ids, name, target, excusable=ties)


@pytest.mark.parametrize("name", SPECS)
def test_config_shapes_build_identically(reference_cache, parity_ids, name):
    """save_pretrained's config (and per-expert tensors) vs the Hub shape (and, for MoE,
    fused expert tensors): bit-identical outputs."""
    lp.assert_shapes_identical(reference_cache, parity_ids, name)
