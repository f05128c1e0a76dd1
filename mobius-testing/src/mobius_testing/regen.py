"""Goldens from the HF reference: writing them (``mobius golden regen``) and checking
that the reference still reproduces the stored ones (``mobius golden reproduce``).

Needs the ``[reference]`` extra. The reference runs in the case's
``reference_dtype`` (float32 unless the case says otherwise: an f16 case may be judged
against HF's own f16) on the GPU when one is there (``device="auto"``). A golden whose margin is under the case's
``min_margin`` is still written (the check reports it as low-confidence) but the
caller is told, so a better prompt can be chosen before committing it. Only a
previous golden is ever overwritten (:mod:`mobius.outdir`'s policy), checked
before the reference runs.

Reproducing is judged by the same gates and tolerances as a package's L4/L5 check
(:func:`~mobius_testing.gates.l4_gate`, :func:`~mobius_testing.gates.l5_gate` with the
case's ``[tolerances]``), never bit for bit: the reference's float32 logits move in
their last bits with the CPU kernels torch dispatches to (measured on the tiny case,
same torch/transformers/numpy: AVX2 vs AVX-512 kernels differ by up to 3.6e-7 in the
top-k logits, 3 ulp; runs on one machine are bit-identical whatever the thread count).
The provenance records ``cpu_capability`` for that reason. What must hold exactly:
the prompt ids and media arrays (:func:`~mobius_testing.golden.same_inputs`) and the
stop ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mobius_testing.cases import TORCH_DTYPES, Case
from mobius_testing.gates import FAIL, GateResult, l4_gate, l5_gate, worst
from mobius_testing.golden import (
    Inputs,
    L5Golden,
    check_golden_targets,
    l4_from_logits,
    read_l4,
    read_l5,
    same_inputs,
    write_l4,
    write_l5,
)
from mobius_testing.reference import HFReference, ReferenceError
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
    ref = reference or _load(case, device)
    inputs = ref.inputs(case)
    provenance = ref.provenance(case)
    result = RegenResult(case.id)
    min_margin = case.tolerances.min_margin
    if "l4" in case.levels:
        logits = ref.prefill_logits(inputs)
        if not np.isfinite(logits).all():
            raise ReferenceError(
                f"the reference's logits are not finite (NaN / inf) in "
                f"{TORCH_DTYPES[case.reference_dtype]}: no golden can be made from them",
                where=f"{case.file}: reference_dtype {case.reference_dtype!r}",
                fix="use reference_dtype f32 (this model overflows in that dtype under HF)",
            )
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


def _load(case: Case, device: str) -> HFReference:
    return HFReference.load(
        case.build_source(),
        revision=case.revision,
        device=device,
        dtype=TORCH_DTYPES[case.reference_dtype],
        media=bool(case.images or case.audio),
    )


# provenance keys whose change can move the reference's logits (shown when they differ)
_NUMERIC_PROVENANCE = (
    "transformers",
    "torch",
    "numpy",
    "device",
    "device_name",
    "cpu_capability",
    "reference_dtype",
    "files",
)


def reproduce_case(
    case: Case,
    *,
    golden_dir: str | Path | None = None,
    device: str = "auto",
    reference: HFReference | None = None,
) -> GateResult:
    """Rerun the reference for ``case`` and gate it against the stored goldens; writes nothing.

    The L4 gate gets the reference's prefill logits, the L5 gate its greedy ids, each
    with the case's tolerances, exactly as a package's check would. The inputs must be
    identical (a changed tokenizer or chat template fails here). The notes carry the
    largest |delta| over the golden's top-k logits (0 when bit-identical) and every
    provenance field that differs.
    """
    gold_dir = golden_dir_for(case, golden_dir)
    # read first: a missing or malformed golden is reported before the reference loads
    goldens = {lv: (read_l4 if lv == "l4" else read_l5)(gold_dir, case.id) for lv in case.levels}
    ref = reference or _load(case, device)
    inputs = ref.inputs(case)
    provenance = ref.provenance(case)
    tol = case.tolerances
    results: list[GateResult] = []
    for level, golden in goldens.items():
        label = f"{case.id} {level.upper()}"
        if not same_inputs(golden.inputs, inputs):
            results.append(
                GateResult(FAIL, [f"{label}: {_inputs_difference(golden.inputs, inputs)}"])
            )
            continue
        if level == "l4":
            logits = ref.prefill_logits(inputs)
            res = l4_gate(golden, logits, tol)
            if logits.shape[-1] == golden.vocab_size:  # else the gate has said so
                last = logits[-1]
                delta = max(
                    (abs(float(last[i]) - v) for i, v in zip(golden.top_ids, golden.top_logits)),
                    default=0.0,
                )
                res.notes.append(
                    f"{label}: reference vs golden top-k logits, max |delta| {delta:.3g}"
                )
        else:
            stops = ref.stop_ids()
            ids, _, _ = ref.greedy(inputs, golden.max_new_tokens, golden.stop_ids)
            res = l5_gate(golden, ids, tol, decode=lambda i: ref.decode([i]), label=label)
            if tuple(stops) != tuple(golden.stop_ids):
                res = worst(
                    res,
                    GateResult(
                        FAIL,
                        [f"{label}: stop ids {list(stops)}, golden {list(golden.stop_ids)}"],
                    ),
                )
        changed = [
            f"{k} {golden.provenance.get(k)!r} -> {provenance.get(k)!r}"
            for k in _NUMERIC_PROVENANCE
            if k != "files" and golden.provenance.get(k) != provenance.get(k)
        ]
        if golden.provenance.get("files") != provenance.get("files"):
            changed.append("the checkpoint's file fingerprints")
        if changed:
            res.notes.append(f"{label}: provenance differs: " + "; ".join(changed))
        results.append(res)
    return worst(*results)


def _inputs_difference(golden: Inputs, actual: Inputs) -> str:
    """Where the reference's inputs stop matching the golden's, in one line."""
    fix = "the tokenizer, chat template or media preprocessing changed; regenerate the goldens"
    g, a = golden.input_ids, actual.input_ids
    if g != a:
        pos = next((i for i, (x, y) in enumerate(zip(g, a)) if x != y), min(len(g), len(a)))
        return (
            f"the reference's prompt ids differ from the golden's at position {pos} "
            f"({len(a)} ids vs {len(g)}): {fix}"
        )
    return f"the reference's media arrays differ from the golden's: {fix}"
