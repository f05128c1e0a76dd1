"""Contract rules about what the runtime allocates and runs, checked before it does.

A package's contract is untrusted input: the runtime zero-fills a state's first
step (``initial_shape``) and an absent modality's input (``absent_shape``), and
skips presence-gated components when their modality is absent. These rules make
sure that allocation is sane and bounded and that skipping a component never
leaves a required input unfed. :class:`mobius.contract.Contract.problems` applies
them, so the build, ``mobius verify`` and ``Pipeline.load`` all refuse the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MAX_ZERO_ELEMENTS = 1 << 24
"""Most elements (per batch row) the runtime may zero-fill for a state's first step or an
absent modality; real packages need none (a zero-length axis) or a few thousand."""


def initial_dims(shape: Iterable[int | str], batch: int) -> tuple[int, ...]:
    """The sizes of a state's first-step zeros for a request of ``batch`` rows.

    Ints are taken as given, ``"batch"`` becomes ``batch``, a sequence axis (a name
    containing ``seq``, ``past`` or ``len``) starts empty (0). Any other symbolic
    name cannot be sized: ValueError.
    """
    out = []
    for dim in shape:
        if isinstance(dim, int) and not isinstance(dim, bool):
            out.append(dim)
        elif dim == "batch":
            out.append(batch)
        elif isinstance(dim, str) and ("seq" in dim or "past" in dim or "len" in dim):
            out.append(0)
        else:
            raise ValueError(
                f"cannot size symbolic dim {dim!r} (use ints, 'batch' or a *seq* name)"
            )
    return tuple(out)


def _fmt(shape: Iterable[Any]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def zero_fill_problems(
    label: str, key: str, shape: tuple[Any, ...], dims: tuple[int, ...]
) -> list[str]:
    """A zero-filled value the runtime allocates must have non-negative, bounded sizes."""
    if any(d < 0 for d in dims):
        return [f"{label} {key} {_fmt(shape)} has a negative dim — sizes are >= 0"]
    elements = 1
    for d in dims:
        elements *= d
    if elements > MAX_ZERO_ELEMENTS:
        return [
            f"{label} {key} {_fmt(shape)} asks the runtime to zero-fill {elements} elements "
            f"per batch row, more than {MAX_ZERO_ELEMENTS} — use a zero-length axis"
        ]
    return []


def presence_problems(contract: Any, components: dict[str, Any]) -> list[str]:
    """A presence-gated component may only feed inputs that fall back to zeros without it."""
    problems = []
    gated = {n: c.presence for n, c in components.items() if c.presence is not None}
    for name, presence in gated.items():
        if not isinstance(presence, str) or not presence:
            problems.append(f"component '{name}' has presence {presence!r} — use a modality name")
    fallbacks = {o.consumer: o.presence for o in contract.optionals}
    for edge in contract.edges:
        producer = edge.producer.partition(".")[0]
        if producer in gated and fallbacks.get(edge.consumer) != gated[producer]:
            problems.append(
                f"edge '{edge.producer} -> {edge.consumer}' comes from '{producer}', which "
                f"runs only with {gated[producer]!r}, but '{edge.consumer}' has no optional "
                f"fallback for {gated[producer]!r} — add one or drop the presence"
            )
    for state in contract.states:
        for end in (state.producer, state.consumer):
            comp = end.partition(".")[0]
            if comp in gated:
                problems.append(
                    f"state edge '{state.producer} -> {state.consumer}' touches '{comp}', "
                    f"which runs only with {gated[comp]!r} — a stateful component cannot "
                    "be presence-gated"
                )
    for out in contract.outputs:
        comp = out.partition(".")[0]
        if comp in gated:
            problems.append(
                f"contract output '{out}' comes from '{comp}', which runs only with "
                f"{gated[comp]!r} — outputs must come from components that always run"
            )
    return problems
