"""L4 and L5 gates on synthetic logits: pass, fail and low-confidence are all reachable."""

from __future__ import annotations

import numpy as np
from mt_helpers import l4_golden, l5_golden, synthetic_logits

from mobius_testing.cases import Tolerances
from mobius_testing.gates import (
    FAIL,
    LOW_CONFIDENCE,
    PASS,
    first_divergence,
    l4_gate,
    l5_gate,
    teacher_forced_ids,
)

TOL = Tolerances(top_k=5, logits_atol=0.01, logits_rtol=0.0, summary_atol=0.01, min_margin=0.5)


def test_l4_identical_logits_pass():
    logits = synthetic_logits()
    result = l4_gate(l4_golden(logits), logits, TOL)
    assert result.outcome == PASS, result.report()


def test_l4_small_noise_within_tolerance_passes_and_batch_axis_is_accepted():
    logits = synthetic_logits()
    noisy = logits + np.random.default_rng(1).uniform(-0.004, 0.004, logits.shape)
    assert l4_gate(l4_golden(logits), noisy[None], TOL).outcome == PASS


def test_l4_same_argmax_but_scaled_logits_fails_on_values():
    logits = synthetic_logits()
    result = l4_gate(l4_golden(logits), logits * 1.1, TOL)
    assert result.outcome == FAIL
    assert "top-5 logits are outside atol" in result.report()
    assert "summary" in result.report()


def test_l4_top1_change_with_clear_margin_fails():
    logits = synthetic_logits()
    golden = l4_golden(logits)
    other = logits.copy()
    other[-1, golden.top_ids[1]] = logits[-1].max() + 5.0
    result = l4_gate(golden, other, TOL)
    assert result.outcome == FAIL
    assert f"top-1 differs: golden {golden.top1}" in result.report()


def test_l4_low_margin_golden_is_low_confidence_not_pass():
    logits = synthetic_logits(margin=0.2)  # every golden margin below min_margin 0.5
    result = l4_gate(l4_golden(logits), logits, TOL)
    assert result.outcome == LOW_CONFIDENCE
    assert "below min_margin" in result.report()


def test_l4_low_margin_argmax_swap_is_low_confidence():
    logits = synthetic_logits(margin=0.0)
    last = logits[-1]
    order = np.argsort(-last)
    last[order[0]] = 1.000
    last[order[1]] = 0.995  # golden margin 0.005
    golden = l4_golden(logits)
    swapped = logits.copy()
    swapped[-1, order[0]], swapped[-1, order[1]] = 0.996, 0.999  # within atol, swapped
    result = l4_gate(golden, swapped, TOL)
    assert result.outcome == LOW_CONFIDENCE, result.report()
    assert "top-1 differs" in result.report()


def test_l4_prompt_position_argmax_is_gated():
    logits = synthetic_logits()
    golden = l4_golden(logits)
    other = logits.copy()
    other[0] = np.roll(other[0], 1)  # position 0 now predicts another id; last untouched
    result = l4_gate(golden, other, TOL)
    assert result.outcome == FAIL
    assert "1 prompt position(s)" in result.report()


def test_l4_shape_mismatch_fails_with_shapes():
    logits = synthetic_logits()
    result = l4_gate(l4_golden(logits), logits[:, :-1], TOL)
    assert result.outcome == FAIL
    assert "does not match the golden" in result.report()


def test_first_divergence_positions_and_lengths():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    d = first_divergence([1, 2, 3], [1, 5, 3])
    assert (d.position, d.expected, d.actual) == (1, 2, 5)
    d = first_divergence([1, 2, 3], [1, 2])
    assert (d.position, d.expected, d.actual) == (2, 3, None)
    d = first_divergence([1, 2], [1, 2, 9])
    assert (d.position, d.expected, d.actual) == (2, None, 9)


def test_l5_reports_first_divergence_with_both_tokens():
    golden = l5_golden([10, 11, 12, 13], pieces=["a", "b", " c", "d"])
    result = l5_gate(golden, [10, 11, 99, 13], TOL, decode=lambda t: f"tok{t}")
    assert result.outcome == FAIL
    text = result.report()
    assert "first divergence at generated position 2" in text
    assert "expected 12 ' c'" in text
    assert "got 99 'tok99'" in text
    assert "preceding golden ids [10, 11]" in text


def test_l5_divergence_at_low_margin_step_is_low_confidence():
    golden = l5_golden([10, 11, 12], margins=[2.0, 0.1, 2.0])
    result = l5_gate(golden, [10, 42, 7], TOL)
    assert result.outcome == LOW_CONFIDENCE
    assert "near tie" in result.report()


def test_l5_early_stop_is_a_divergence():
    golden = l5_golden([10, 11, 12])
    result = l5_gate(golden, [10, 11], TOL)
    assert result.outcome == FAIL
    assert "<end of sequence>" in result.report()


def test_l5_match_passes():
    assert l5_gate(l5_golden([3, 4]), [3, 4], TOL).outcome == PASS


def test_teacher_forced_ids_reads_the_right_positions():
    logits = np.zeros((1, 6, 8))
    for pos, tid in enumerate([0, 0, 0, 5, 6, 7]):
        logits[0, pos, tid] = 1.0
    assert teacher_forced_ids(logits, prompt_len=4, n=3) == [5, 6, 7]
