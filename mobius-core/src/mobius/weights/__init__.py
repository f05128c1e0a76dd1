"""Weight plans: how each ONNX initializer is made from checkpoint tensors, lazily.

A plugin returns a :class:`WeightPlan` mapping initializer names to
:class:`TensorExpr` trees (``ref("q_proj.weight").transpose().cast("float16")``).
Nothing is read when the plan is made or bound: :func:`bind` checks every entry
against the graph from safetensors headers alone (shapes and dtypes are computed,
not read) and attaches a :class:`PlannedTensor` (an ``onnx_ir.LazyTensor``) to each
initializer. The package writer takes them one at a time and, for every expression
that can be streamed (a checkpoint tensor with casts, scales and reshapes, slices and
concatenations that stay contiguous — see :meth:`TensorExpr.iter_chunks`), writes it in
bounded chunks read with plain file reads into a reused buffer. Peak memory then stays
near the chunk size (64 MiB) plus the largest *non-streamable* tensor (a transposed
Linear weight), not the largest tensor (a 4.4 GiB per-layer embedding table).

Why plain reads and not a memory map: pages of a mapped file that the process touched
count in its resident set until the mapping goes away, so a memory-mapped 4 GiB table
costs 4 GiB of RSS even when consumed in slices. ``readinto`` a reused buffer goes
through the page cache, which the kernel reclaims freely.

When a floating-point initializer is materialized it is scanned (chunked, with
``np.isfinite``) for NaN and infinite values; any found are reported with a
:class:`NonFiniteWeightWarning` (a ``warnings.warn``, so ``-W error::...`` or a
warnings filter can turn it into a failure) naming the initializer and the
checkpoint tensors it came from. It is a warning, not an error: some checkpoints
carry deliberate ``-inf`` masks, and the user decides.

Modules: :mod:`mobius.weights.dtypes` (dtype tables, limits), :mod:`mobius.weights.expr`
(the lazy expression tree), :mod:`mobius.weights.plan` (plans, binding, the lazy
initializer tensor), :mod:`mobius.weights.finite` (the NaN / infinity check). Every
public name is re-exported here: ``from mobius.weights import X``.
"""

from mobius.weights.dtypes import (
    CHUNK_BYTES,
    IR_DTYPES,
    NUMPY_DTYPES,
    Shape,
    cast_problem,
)
from mobius.weights.expr import TensorExpr, concat, constant, ref
from mobius.weights.finite import FINITE_CHECK_CHUNK, NonFiniteWeightWarning, count_non_finite
from mobius.weights.plan import (
    BindReport,
    PlannedTensor,
    WeightPlan,
    bind,
    non_float_sources,
    plan_problems,
    unused_tensors,
)

__all__ = [
    "CHUNK_BYTES",
    "FINITE_CHECK_CHUNK",
    "IR_DTYPES",
    "NUMPY_DTYPES",
    "BindReport",
    "NonFiniteWeightWarning",
    "PlannedTensor",
    "Shape",
    "TensorExpr",
    "WeightPlan",
    "bind",
    "cast_problem",
    "concat",
    "constant",
    "count_non_finite",
    "non_float_sources",
    "plan_problems",
    "ref",
    "unused_tensors",
]
