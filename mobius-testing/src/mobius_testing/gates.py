"""The L4 and L5 gates: pure numpy, so they are tested on synthetic logits.

Three outcomes, never two: ``pass``, ``fail`` and ``low-confidence``. A golden
whose top-1/top-2 margin is below ``min_margin`` cannot tell a real regression
from kernel drift; such a case is reported as low-confidence (the pytest plugin
turns it into a warning and a separate outcome in the summary), not passed
silently and not failed. Value checks (top-k logits, the summary) fail
whatever the margin: a missing softcap or a scaled final norm keeps the argmax
but moves the values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mobius_testing.cases import Tolerances
from mobius_testing.golden import L4Golden, L5Golden, summary_of

PASS = "pass"
FAIL = "fail"
LOW_CONFIDENCE = "low-confidence"


@dataclass
class GateResult:
    """Outcome plus every line worth showing; ``problems`` explain a fail, ``notes`` the rest."""

    outcome: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def report(self) -> str:
        return "\n".join([f"outcome: {self.outcome}", *self.problems, *self.notes])


def _close(actual: float, expected: float, atol: float, rtol: float) -> bool:
    return abs(actual - expected) <= atol + rtol * abs(expected)


def l4_gate(golden: L4Golden, logits: np.ndarray, tol: Tolerances) -> GateResult:
    """Compare one prefill's logits (``[S, V]`` or ``[1, S, V]``) with an L4 golden."""
    arr = np.asarray(logits, dtype=np.float64)
    if arr.ndim == 3:
        if arr.shape[0] != 1:
            return GateResult(FAIL, [f"expected batch 1 logits, got shape {list(arr.shape)}"])
        arr = arr[0]
    problems: list[str] = []
    notes: list[str] = []
    n_pos = len(golden.positions_top1)
    if arr.ndim != 2 or arr.shape[-1] != golden.vocab_size or arr.shape[0] != n_pos:
        return GateResult(
            FAIL,
            [
                f"logits shape {list(arr.shape)} does not match the golden "
                f"[{n_pos}, {golden.vocab_size}] (prompt positions, vocab)"
            ],
        )
    last = arr[-1]
    actual_top1 = int(last.argmax())
    low = golden.margin < tol.min_margin
    if low:
        notes.append(
            f"golden top-1/top-2 margin {golden.margin:.4g} is below min_margin "
            f"{tol.min_margin:g}: the argmax comparison is low-confidence"
        )
    if actual_top1 != golden.top1:
        line = (
            f"top-1 differs: golden {golden.top1} (logit {golden.top_logits[0]:.6g}), "
            f"package {actual_top1} (logit {last[actual_top1]:.6g}; its logit for the "
            f"golden id: {last[golden.top1]:.6g})"
        )
        (notes if low else problems).append(line)

    bad = []
    for tid, expected in zip(golden.top_ids[: tol.top_k], golden.top_logits[: tol.top_k]):
        got = float(last[tid])
        if not _close(got, expected, tol.logits_atol, tol.logits_rtol):
            bad.append(
                f"id {tid}: golden {expected:.6g}, package {got:.6g}, diff {got - expected:+.3g}"
            )
    if bad:
        problems.append(
            f"{len(bad)} of the golden top-{min(tol.top_k, len(golden.top_ids))} logits are "
            f"outside atol {tol.logits_atol:g} + rtol {tol.logits_rtol:g}: " + "; ".join(bad)
        )
    got_summary = summary_of(last)
    off = [
        f"{k}: golden {golden.summary[k]:.6g}, package {got_summary[k]:.6g}"
        for k in ("mean", "std", "min", "max")
        if k in golden.summary
        and not _close(got_summary[k], golden.summary[k], tol.summary_atol, 0.0)
    ]
    if off:
        problems.append(f"logits summary outside atol {tol.summary_atol:g}: " + "; ".join(off))

    # every prompt position whose golden margin is clear must agree on the argmax
    pos_top1 = arr.argmax(axis=-1)
    firm_bad, soft_bad = [], []
    for i, (expected, margin) in enumerate(zip(golden.positions_top1, golden.positions_margin)):
        if int(pos_top1[i]) != expected:
            (soft_bad if margin < tol.min_margin else firm_bad).append(
                f"{i} (golden {expected}, package {int(pos_top1[i])}, golden margin {margin:.3g})"
            )
    if firm_bad:
        problems.append(
            f"argmax differs at {len(firm_bad)} prompt position(s) with a clear golden margin: "
            + ", ".join(firm_bad[:8])
        )
    if soft_bad:
        notes.append(
            f"argmax differs at {len(soft_bad)} low-margin prompt position(s): "
            + ", ".join(soft_bad[:8])
        )
    if problems:
        return GateResult(FAIL, problems, notes)
    return GateResult(LOW_CONFIDENCE if low else PASS, problems, notes)


@dataclass(frozen=True)
class Divergence:
    """Where two id sequences first differ; ``None`` ids mean the sequence had ended."""

    position: int
    expected: int | None
    actual: int | None


def first_divergence(expected: Sequence[int], actual: Sequence[int]) -> Divergence | None:
    """The first index where ``actual`` differs from ``expected`` (length counts), or None."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if int(e) != int(a):
            return Divergence(i, int(e), int(a))
    if len(expected) != len(actual):
        i = min(len(expected), len(actual))
        return Divergence(
            i,
            int(expected[i]) if i < len(expected) else None,
            int(actual[i]) if i < len(actual) else None,
        )
    return None


def _token(tid: int | None, decode: Callable[[int], str] | None) -> str:
    if tid is None:
        return "<end of sequence>"
    if decode is None:
        return str(tid)
    try:
        return f"{tid} {decode(tid)!r}"
    except Exception as exc:  # decoding is for the report only
        return f"{tid} <cannot decode: {exc}>"


def l5_gate(
    golden: L5Golden,
    actual: Sequence[int],
    tol: Tolerances,
    *,
    decode: Callable[[int], str] | None = None,
    label: str = "greedy",
) -> GateResult:
    """Compare generated (or teacher-forced argmax) ids with an L5 golden.

    The first diverging position is reported with both tokens (id and text). A
    divergence where the golden's own margin was under ``min_margin`` is
    low-confidence; any other divergence fails.
    """
    div = first_divergence(golden.ids, list(actual))
    if div is None:
        return GateResult(PASS, notes=[f"{label}: all {len(golden.ids)} ids match"])
    expected_text = (
        f"{div.expected} {golden.pieces[div.position]!r}"
        if div.expected is not None and div.position < len(golden.pieces)
        else _token(div.expected, decode)
    )
    line = (
        f"{label}: first divergence at generated position {div.position} "
        f"(after {div.position} matching ids): expected {expected_text}, "
        f"got {_token(div.actual, decode)}"
    )
    margin = golden.margins[div.position] if div.position < len(golden.margins) else None
    if margin is not None:
        line += f"; golden margin there {margin:.4g}"
    context = golden.ids[max(0, div.position - 4) : div.position]
    if context:
        line += f"; preceding golden ids {list(context)}"
    if margin is not None and margin < tol.min_margin and div.expected is not None:
        return GateResult(
            LOW_CONFIDENCE,
            notes=[line + f" (below min_margin {tol.min_margin:g}: a near tie, low-confidence)"],
        )
    return GateResult(FAIL, problems=[line])


def teacher_forced_ids(logits: np.ndarray, prompt_len: int, n: int) -> list[int]:
    """Argmax ids predicted for the golden continuation from one forward over prompt + golden.

    ``logits`` ``[1, S, V]`` of ``prompt + golden[:-1]``: position ``prompt_len - 1 + i``
    predicts generated id ``i``.
    """
    arr = np.asarray(logits)
    if arr.ndim == 3:
        arr = arr[0]
    return [int(i) for i in arr[prompt_len - 1 : prompt_len - 1 + n].argmax(axis=-1)]


def worst(*results: GateResult) -> GateResult:
    """Merge results: fail beats low-confidence beats pass; all lines kept."""
    rank = {PASS: 0, LOW_CONFIDENCE: 1, FAIL: 2}
    outcome = max((r.outcome for r in results), key=rank.__getitem__, default=PASS)
    merged = GateResult(outcome)
    for r in results:
        merged.problems.extend(r.problems)
        merged.notes.extend(r.notes)
    return merged
