"""Writing goldens for a case from the HF reference (``mobius golden regen``).

Needs the ``[reference]`` extra. The reference runs in float32 on the GPU when
one is there (``device="auto"``). A golden whose margin is under the case's
``min_margin`` is still written (the check reports it as low-confidence) but the
caller is told, so a better prompt can be chosen before committing it. Only a
previous golden is ever overwritten (:mod:`mobius.outdir`'s policy), checked
before the reference runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mobius_testing.cases import Case
from mobius_testing.golden import (
    L5Golden,
    check_golden_targets,
    l4_from_logits,
    write_l4,
    write_l5,
)
from mobius_testing.reference import HFReference
from mobius_testing.runner import golden_dir_for


@dataclass
class RegenResult:
    case: str
    written: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def regen_case(
    case: Case,
    *,
    golden_dir: str | Path | None = None,
    device: str = "auto",
    reference: HFReference | None = None,
) -> RegenResult:
    """Run the reference for ``case`` and write its L4/L5 goldens."""
    out_dir = golden_dir_for(case, golden_dir)
    check_golden_targets(out_dir, case.id, [lv for lv in ("l4", "l5") if lv in case.levels])
    ref = reference or HFReference.load(
        case.source,
        revision=case.revision,
        device=device,
        media=bool(case.images or case.audio),
    )
    inputs = ref.inputs(case)
    provenance = ref.provenance(case)
    result = RegenResult(case.id)
    min_margin = case.tolerances.min_margin
    if "l4" in case.levels:
        logits = ref.prefill_logits(inputs)
        golden = l4_from_logits(case.id, inputs, logits, case.tolerances.top_k, provenance)
        result.written.append(write_l4(out_dir, golden))
        if golden.margin < min_margin:
            result.warnings.append(
                f"{case.id} L4: top-1/top-2 margin {golden.margin:.4g} < min_margin "
                f"{min_margin:g}; the check will report it as low-confidence (pick another prompt)"
            )
    if "l5" in case.levels:
        stops = ref.stop_ids()
        ids, margins, reason = ref.greedy(inputs, case.max_new_tokens, stops)
        golden5 = L5Golden(
            case=case.id,
            inputs=inputs,
            ids=tuple(ids),
            text=ref.decode(ids),
            pieces=tuple(ref.decode([i]) for i in ids),
            margins=tuple(margins),
            stop_ids=stops,
            stop_reason=reason,
            max_new_tokens=case.max_new_tokens,
            provenance=provenance,
        )
        result.written.append(write_l5(out_dir, golden5))
        low = [i for i, m in enumerate(margins) if m < min_margin]
        if low:
            result.warnings.append(
                f"{case.id} L5: {len(low)} step(s) with margin < {min_margin:g} "
                f"(first at step {low[0]}); a divergence there is reported as low-confidence"
            )
    return result
