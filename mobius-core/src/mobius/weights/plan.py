"""Weight plans and binding: :class:`WeightPlan`, :func:`bind` and the lazy
:class:`PlannedTensor` it attaches to each initializer."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from mobius.errors import WeightPlanError
from mobius.weights.dtypes import (
    CHUNK_BYTES,
    FLOATS,
    IR_DTYPES,
    NAME_OF_IR,
    NUMPY_DTYPES,
    Shape,
)
from mobius.weights.expr import TensorExpr, _Constant, _Reshape
from mobius.weights.finite import count_non_finite, warn_non_finite

if TYPE_CHECKING:
    from mobius.checkpoint import Checkpoint


class WeightPlan:
    """Initializer name -> expression, plus checkpoint tensors known to be unused."""

    def __init__(self) -> None:
        self._entries: dict[str, TensorExpr] = {}
        self._ignored: dict[str, str] = {}
        self.entries: Mapping[str, TensorExpr] = MappingProxyType(self._entries)
        self.ignored: Mapping[str, str] = MappingProxyType(self._ignored)

    def __repr__(self) -> str:
        return f"WeightPlan({len(self._entries)} entries, {len(self._ignored)} ignored)"

    def add(self, initializer: str, expr: TensorExpr) -> None:
        """Say that initializer ``initializer`` is computed by ``expr``."""
        if not isinstance(expr, TensorExpr):
            raise TypeError(f"WeightPlan.add({initializer!r}, ...) needs a TensorExpr")
        if initializer in self._entries:
            raise WeightPlanError(
                f"initializer {initializer!r} is planned twice",
                where=f"{self._entries[initializer]!r} and {expr!r}",
                fix="add each initializer to the weight plan once",
            )
        self._entries[initializer] = expr

    def ignore(self, checkpoint_tensor: str, reason: str) -> None:
        """Mark a checkpoint tensor as deliberately unused (reported at info level)."""
        self._ignored[checkpoint_tensor] = reason


@dataclass(frozen=True)
class BindReport:
    """What :func:`bind` did for one component."""

    bound: int
    """Number of initializers that received a lazy tensor."""
    referenced: frozenset[str]
    """Checkpoint tensors read by this component's plan."""
    ignored: Mapping[str, str]
    """Checkpoint tensors this plan marked unused, with the reason."""
    unused: tuple[str, ...] = ()
    """Checkpoint tensors this component neither referenced nor ignored (sorted); the
    build intersects these over all components (see :func:`unused_tensors`)."""


def unused_tensors(checkpoint: Checkpoint, reports: Sequence[BindReport]) -> tuple[str, ...]:
    """Checkpoint tensors no component referenced and no plan ignored, sorted."""
    seen: set[str] = set()
    for report in reports:
        seen |= report.referenced
        seen |= set(report.ignored)
    return tuple(sorted(set(checkpoint.tensors) - seen))


def _graph_shape(value: ir.Value) -> tuple[int, ...] | None:
    if value.shape is None:
        return None
    dims = []
    for d in value.shape:
        if not isinstance(d, int):
            return None
        dims.append(d)
    return tuple(dims)


class PlannedTensor(ir.LazyTensor):
    """The lazy tensor :func:`bind` attaches to an initializer: a plan entry, bound.

    ``numpy()`` / ``tobytes()`` evaluate the whole expression (as any
    ``ir.LazyTensor``); :meth:`iter_chunks` streams it instead when the expression
    allows, which is what the package writer uses. Either way the float data is
    scanned for NaN / infinity and a :class:`NonFiniteWeightWarning` is issued once.
    """

    def __init__(
        self,
        expr: TensorExpr,
        checkpoint: Checkpoint,
        dtype: str,
        shape: Shape,
        *,
        name: str,
        component: str,
    ) -> None:
        self.expr = expr
        self.checkpoint = checkpoint
        self.component = component
        self._np_dtype = NUMPY_DTYPES[dtype]
        self._checked = False  # a lazy tensor may be loaded more than once; warn once
        super().__init__(self._load, dtype=IR_DTYPES[dtype], shape=ir.Shape(shape), name=name)

    def _load(self) -> ir.Tensor:
        array = self.expr.evaluate(self.checkpoint)
        if array.dtype != self._np_dtype:  # shape_dtype said so; guard against a lying constant
            array = array.astype(self._np_dtype)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array).reshape(array.shape)  # keeps 0-d shapes
        if not self._checked:
            self._checked = True
            self._warn(*count_non_finite(array), array.size)
        return ir.Tensor(np.asarray(array), dtype=self.dtype, name=self.name)

    def iter_chunks(self, max_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray] | None:
        """The tensor's data as 1-D chunks of at most ``max_bytes`` (see
        :meth:`TensorExpr.iter_chunks`), or None when the expression cannot be streamed.

        Each chunk is scanned for NaN / infinity as it passes; the warning comes once
        the last chunk has been consumed.
        """
        chunks = self.expr.iter_chunks(self.checkpoint, max_bytes)
        if chunks is None:
            return None
        return self._checked_chunks(chunks)

    def _checked_chunks(self, chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        nan = inf = size = 0
        for chunk in chunks:
            if chunk.dtype != self._np_dtype:  # guard against a lying constant
                chunk = chunk.astype(self._np_dtype)
            if not self._checked:
                n, i = count_non_finite(chunk)
                nan, inf = nan + n, inf + i
            size += chunk.size
            yield chunk
        if not self._checked:
            self._checked = True
            self._warn(nan, inf, size)

    def share_key(self) -> tuple[object, ...] | None:
        """What makes two planned tensors the same bytes: the checkpoint, the expression
        (its ``repr`` names every source and transform, quantize steps with their scheme)
        less any outer reshape (the bytes of a C-order reshape are its source's), dtype
        and element count; None when the expression holds a constant (its ``repr`` does
        not show the values). The package writer stores tensors of equal keys once.
        """
        expr = self.expr
        while isinstance(expr, _Reshape):
            expr = expr.src
        if _holds_constant(expr):
            return None
        return (id(self.checkpoint), repr(expr), self.dtype, self.size)

    def _warn(self, nan: int, inf: int, size: int) -> None:
        warn_non_finite(nan, inf, size, self.expr, self.name or "", self.component)


def _holds_constant(expr: TensorExpr) -> bool:
    return isinstance(expr, _Constant) or any(_holds_constant(c) for c in expr.children())


SHOWN_MISSING = 20
"""How many missing checkpoint tensor names an error lists (the count is always given)."""


def plan_problems(plan: WeightPlan, checkpoint: Checkpoint) -> tuple[list[str], set[str]]:
    """What is wrong with ``plan`` against ``checkpoint`` alone, before any graph exists.

    Checks that every checkpoint tensor the plan reads exists and that every entry's
    expression applies to the tensors' real shapes and dtypes (transpose, reshape,
    concat, slice, casts). Returns the problems (one line each; missing names
    listed up to :data:`SHOWN_MISSING`) and the plan entries that cannot be resolved.
    Nothing is read but safetensors headers.

    Why separately from :func:`bind`: the builder runs it for every component
    before building any graph, so a checkpoint that cannot match its config (a
    config claiming 4,096 layers, a renamed tensor) is refused in seconds instead
    of after minutes of graph building.
    """
    entries = plan.entries
    referenced = {name for expr in entries.values() for name in expr.refs()}
    if referenced and not checkpoint.tensors:
        checkpoint.require_weights()  # explains why (pickle only, no weights) and how to fix
    problems: list[str] = []
    missing = sorted(name for name in referenced if name not in checkpoint.tensors)
    if missing:
        shown = ", ".join(missing[:SHOWN_MISSING])
        more = len(missing) - SHOWN_MISSING
        problems.append(
            f"checkpoint tensors missing ({len(missing)}): {shown}"
            + (f" and {more} more" if more > 0 else "")
        )
    unresolved: set[str] = set()
    for name, expr in entries.items():
        if any(r not in checkpoint.tensors for r in expr.refs()):
            unresolved.add(name)
            continue
        try:
            expr.shape_dtype(checkpoint)
        except WeightPlanError as exc:
            problems.append(f"initializer {name!r}: {exc.what} in {exc.where or expr!r}")
            unresolved.add(name)
    return problems, unresolved


def non_float_sources(plan: WeightPlan, checkpoint: Checkpoint) -> list[tuple[str, str, str]]:
    """(initializer, checkpoint tensor, its dtype) where an integer or bool tensor is cast
    into a float parameter, from headers only.

    Why: a raw int8 or bitsandbytes checkpoint (int8 / uint8 data, with scales kept
    elsewhere) was cast to float without a word, and the model generated garbage;
    the builder refuses such a checkpoint, naming the tensor and its dtype.
    """
    found = []
    for name, expr in plan.entries.items():
        if any(r not in checkpoint.tensors for r in expr.refs()):
            continue  # plan_problems reports it
        try:
            _, dtype = expr.shape_dtype(checkpoint)
        except WeightPlanError:
            continue  # plan_problems reports it
        if dtype not in FLOATS:
            continue
        for ref_name in dict.fromkeys(expr.refs()):
            source = checkpoint.tensors[ref_name].dtype_name
            if source not in FLOATS:
                found.append((name, ref_name, source))
    return found


def bind(
    model: ir.Model, plan: WeightPlan, checkpoint: Checkpoint, *, component: str
) -> BindReport:
    """Attach a lazy tensor to every data-less initializer of ``model`` from ``plan``.

    Every problem is collected first (missing checkpoint tensors, initializers
    without a plan entry, entries for initializers not in the graph, bad
    transforms, shape and dtype mismatches) and raised as one
    :class:`~mobius.errors.WeightPlanError`. Initializers that already carry data
    (architecture constants) are left alone. Nothing is read here.
    """
    initializers = model.graph.initializers
    entries = plan.entries
    referenced = {name for expr in entries.values() for name in expr.refs()}
    problems, unresolved = plan_problems(plan, checkpoint)
    resolved: dict[str, tuple[TensorExpr, tuple[int, ...], str]] = {}
    for name, init in initializers.items():
        if init.const_value is not None:
            if name in entries:
                problems.append(
                    f"initializer {name!r} already carries data but the plan also gives it "
                    f"{entries[name]!r}"
                )
            continue
        expr = entries.get(name)
        if expr is None:
            problems.append(f"initializer {name!r} has no weight plan entry")
            continue
        if name in unresolved:
            continue  # already reported by plan_problems
        shape, dtype = expr.shape_dtype(checkpoint)
        graph_shape = _graph_shape(init)
        if graph_shape is None:
            problems.append(f"initializer {name!r} has no static shape in the graph")
        elif graph_shape != shape:
            problems.append(
                f"initializer {name!r}: shape mismatch, planned {list(shape)} "
                f"vs graph {list(graph_shape)} ({expr!r})"
            )
        graph_dtype = NAME_OF_IR.get(init.dtype) if init.dtype is not None else None
        if graph_dtype != dtype:
            problems.append(
                f"initializer {name!r}: dtype mismatch, planned {dtype} vs graph "
                f"{graph_dtype or init.dtype} ({expr!r})"
            )
        resolved[name] = (expr, shape, dtype)
    for name in sorted(set(entries) - set(initializers)):
        problems.append(f"plan entry {name!r} names no initializer of the graph")

    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise WeightPlanError(
            f"{len(problems)} problem(s) binding the weights of component {component!r}:\n"
            f"{listing}",
            where=f"component {component!r}, checkpoint {checkpoint.root}",
            fix="fix the family plugin's weight plan (mobius_weight_plan) or use the "
            "checkpoint it was written for",
        )

    for name, (expr, shape, dtype) in resolved.items():
        initializers[name].const_value = PlannedTensor(
            expr, checkpoint, dtype, shape, name=name, component=component
        )
    return BindReport(
        bound=len(resolved),
        referenced=frozenset(referenced),
        ignored=MappingProxyType(dict(plan.ignored)),
        unused=tuple(sorted(set(checkpoint.tensors) - referenced - set(plan.ignored))),
    )
