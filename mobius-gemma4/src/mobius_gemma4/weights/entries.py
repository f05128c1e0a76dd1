"""Weight plans from rename tables ``(initializer, checkpoint name, transpose)``.

The encoder plans (vision, audio, unified) are plain renames: each initializer reads
one checkpoint tensor, transposed from HF's ``[out, in]`` to ``[in, out]`` where the
graph multiplies by it, and cast to the build's port dtype. One loop serves them all so
they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE, BuildOptions
from mobius.weights import WeightPlan, ref

CKPT_PREFIX = "model."
"""What HF's ``*ForConditionalGeneration`` puts before the module names on disk."""


def plan_from_entries(
    entries: Iterable[tuple[str, str, bool]],
    options: BuildOptions,
    *,
    source: Callable[[str, str], str] | None = None,
) -> WeightPlan:
    """A plan with one ``ref(source).transpose()?.cast(dtype)`` per entry.

    ``source(initializer, name)`` names the checkpoint tensor to read; by default it is
    ``model.`` + ``name``.
    """
    dtype = PORT_DTYPE_OF_BUILD_DTYPE[options.dtype]
    plan = WeightPlan()
    for init, name, transpose in entries:
        expr = ref(source(init, name) if source is not None else CKPT_PREFIX + name)
        if transpose:
            expr = expr.transpose()
        plan.add(init, expr.cast(dtype))
    return plan
