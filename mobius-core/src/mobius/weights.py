"""Weight plans: how each ONNX initializer is made from checkpoint tensors, lazily.

A plugin returns a :class:`WeightPlan` mapping initializer names to
:class:`TensorExpr` trees (``ref("q_proj.weight").transpose().cast("float16")``).
Nothing is read when the plan is made or bound: :func:`bind` checks every entry
against the graph from safetensors headers alone (shapes and dtypes are computed,
not read) and attaches an ``onnx_ir.LazyTensor`` to each initializer. The package
writer materializes those one at a time, so peak memory stays near the largest
single tensor rather than the whole model.

When a floating-point initializer is materialized it is scanned (chunked, with
``np.isfinite``) for NaN and infinite values; any found are reported with a
:class:`NonFiniteWeightWarning` (a ``warnings.warn``, so ``-W error::...`` or a
warnings filter can turn it into a failure) naming the initializer and the
checkpoint tensors it came from. It is a warning, not an error: some checkpoints
carry deliberate ``-inf`` masks, and the user decides.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius.errors import WeightPlanError

if TYPE_CHECKING:
    from mobius.checkpoint import Checkpoint

NUMPY_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype(np.float64),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}
"""numpy dtype of each mobius dtype name a weight plan may produce."""

IR_DTYPES: dict[str, ir.DataType] = {
    "float32": ir.DataType.FLOAT,
    "float16": ir.DataType.FLOAT16,
    "bfloat16": ir.DataType.BFLOAT16,
    "float64": ir.DataType.DOUBLE,
    "int64": ir.DataType.INT64,
    "int32": ir.DataType.INT32,
    "int16": ir.DataType.INT16,
    "int8": ir.DataType.INT8,
    "uint8": ir.DataType.UINT8,
    "bool": ir.DataType.BOOL,
}
"""onnx_ir data type of each mobius dtype name."""

_NAME_OF_IR = {v: k for k, v in IR_DTYPES.items()}
_FLOATS = ("float32", "float16", "bfloat16", "float64")
_HALF_FLOATS = ("float16", "bfloat16")

FINITE_CHECK_CHUNK = 1 << 22
"""Elements scanned per ``np.isfinite`` call, so the check's scratch memory stays small."""


class NonFiniteWeightWarning(UserWarning):
    """An initializer holds NaN or infinite values (after its weight-plan transforms)."""


def cast_problem(src: str, dst: str) -> str | None:
    """Why a weight plan may not cast ``src`` to ``dst`` (mobius dtype names), or None.

    Floats convert among themselves. Integer and bool data never become 16-bit
    floats (they would silently lose values above 256 or 2048), floats never become
    integers or bool (truncation), and nothing but bool becomes bool. Integers may
    widen or narrow among integer types and become float32 / float64.
    """
    if src == dst:
        return None
    if dst not in NUMPY_DTYPES:
        return f"{dst!r} is not a weight dtype"
    if src in _FLOATS:
        return None if dst in _FLOATS else f"casting {src} to {dst} would truncate the values"
    if dst == "bool":
        return f"casting {src} to bool would collapse the values to 0/1"
    if dst in _HALF_FLOATS:
        return f"{src} data cannot be cast to {dst} without losing values"
    return None


Shape = tuple[int, ...]


def _dtype_name_of_numpy(dtype: np.dtype) -> str:
    for name, candidate in NUMPY_DTYPES.items():
        if candidate == dtype:
            return name
    raise WeightPlanError(
        f"constant has dtype {dtype}, which weight plans do not support",
        fix=f"convert the constant to one of {', '.join(NUMPY_DTYPES)}",
    )


class TensorExpr(ABC):
    """A lazy tensor: a checkpoint tensor or constant and the transforms applied to it.

    Build trees with :func:`ref`, :func:`constant`, :func:`concat` and the
    chainable methods; :meth:`shape_dtype` reads headers only, :meth:`evaluate`
    reads data (by memory map) and computes the result.
    """

    @abstractmethod
    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        """Output shape and mobius dtype name, from headers only; WeightPlanError if invalid."""

    @abstractmethod
    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        """Compute the tensor (reads checkpoint data by memory map)."""

    def children(self) -> tuple[TensorExpr, ...]:
        """Direct sub-expressions."""
        return ()

    def refs(self) -> Iterator[str]:
        """Names of every checkpoint tensor this expression reads."""
        for child in self.children():
            yield from child.refs()

    def cast(self, dtype: str) -> TensorExpr:
        """Convert to ``dtype`` (``float32``, ``float16``, ``bfloat16``, ``int64`` …)."""
        if dtype not in NUMPY_DTYPES:
            raise WeightPlanError(
                f"cannot cast to {dtype!r}",
                where=repr(self),
                fix=f"use one of {', '.join(NUMPY_DTYPES)}",
            )
        return _Cast(self, dtype)

    def transpose(self, perm: Sequence[int] | None = None) -> TensorExpr:
        """Permute axes; ``None`` reverses them (``[out, in]`` -> ``[in, out]`` for 2-D)."""
        return _Transpose(self, None if perm is None else tuple(int(p) for p in perm))

    def reshape(self, shape: Sequence[int]) -> TensorExpr:
        """Reshape; one dimension may be ``-1`` (inferred)."""
        return _Reshape(self, tuple(int(d) for d in shape))

    def scale(self, factor: float) -> TensorExpr:
        """Multiply by ``factor`` in float32 (float64 stays float64), keeping the dtype."""
        return _Scale(self, float(factor))

    def slice(self, axis: int, start: int, stop: int) -> TensorExpr:
        """Keep indices ``start:stop`` of ``axis`` (0 <= start <= stop <= dim)."""
        return _Slice(self, int(axis), int(start), int(stop))


@dataclass(frozen=True, eq=False)
class _Ref(TensorExpr):
    name: str

    def __repr__(self) -> str:
        return f"ref({self.name!r})"

    def refs(self) -> Iterator[str]:
        yield self.name

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        info = checkpoint.tensors.get(self.name)
        if info is None:
            raise WeightPlanError(
                f"checkpoint tensor {self.name!r} is missing",
                where=str(checkpoint.root),
                fix="check the tensor name in the weight plan",
            )
        return tuple(info.shape), info.dtype_name

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        return checkpoint.read(self.name)


@dataclass(frozen=True, eq=False)
class _Constant(TensorExpr):
    array: np.ndarray

    def __repr__(self) -> str:
        return f"constant({self.array.dtype}{list(self.array.shape)})"

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        return tuple(self.array.shape), _dtype_name_of_numpy(self.array.dtype)

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        return self.array


@dataclass(frozen=True, eq=False)
class _Concat(TensorExpr):
    parts: tuple[TensorExpr, ...]
    axis: int

    def __repr__(self) -> str:
        return f"concat([{', '.join(map(repr, self.parts))}], axis={self.axis})"

    def children(self) -> tuple[TensorExpr, ...]:
        return self.parts

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        if not self.parts:
            raise WeightPlanError("concat of no tensors", where=repr(self))
        results = [p.shape_dtype(checkpoint) for p in self.parts]
        shape0, dtype0 = results[0]
        axis = _axis(self, self.axis, len(shape0))
        total = 0
        for part, (shape, dtype) in zip(self.parts, results):
            if dtype != dtype0:
                raise WeightPlanError(
                    f"concat mixes dtypes {dtype0} and {dtype} ({part!r})",
                    where=repr(self),
                    fix="cast the parts to one dtype first",
                )
            if len(shape) != len(shape0) or any(
                a != b for i, (a, b) in enumerate(zip(shape, shape0)) if i != axis
            ):
                raise WeightPlanError(
                    f"concat along axis {self.axis} of shapes {list(shape0)} and {list(shape)} "
                    f"({part!r}): other dimensions differ",
                    where=repr(self),
                )
            total += shape[axis]
        return (*shape0[:axis], total, *shape0[axis + 1 :]), dtype0

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        arrays = [p.evaluate(checkpoint) for p in self.parts]
        return np.concatenate(arrays, axis=self.axis)


@dataclass(frozen=True, eq=False)
class _Cast(TensorExpr):
    src: TensorExpr
    dtype: str

    def __repr__(self) -> str:
        return f"{self.src!r}.cast({self.dtype!r})"

    def children(self) -> tuple[TensorExpr, ...]:
        return (self.src,)

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        shape, src = self.src.shape_dtype(checkpoint)
        problem = cast_problem(src, self.dtype)
        if problem is not None:
            raise WeightPlanError(
                f"cannot cast: {problem}",
                where=repr(self),
                fix="cast only floating-point weights between float dtypes; keep integer "
                "tensors integer (or cast them to float32 explicitly first)",
            )
        return shape, self.dtype

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        array = self.src.evaluate(checkpoint)
        target = NUMPY_DTYPES[self.dtype]
        if array.dtype == target:
            return array
        if array.dtype == NUMPY_DTYPES["bfloat16"] and target != NUMPY_DTYPES["float32"]:
            array = array.astype(np.float32)  # ml_dtypes casts exactly through float32
        with np.errstate(over="ignore"):  # overflow to inf is reported by the finite check
            return array.astype(target)


@dataclass(frozen=True, eq=False)
class _Transpose(TensorExpr):
    src: TensorExpr
    perm: tuple[int, ...] | None

    def __repr__(self) -> str:
        return f"{self.src!r}.transpose({'' if self.perm is None else list(self.perm)})"

    def children(self) -> tuple[TensorExpr, ...]:
        return (self.src,)

    def _perm(self, rank: int) -> tuple[int, ...]:
        if self.perm is None:
            return tuple(reversed(range(rank)))
        if sorted(self.perm) != list(range(rank)):
            raise WeightPlanError(
                f"transpose perm {list(self.perm)} is not a permutation of the {rank} axes",
                where=repr(self),
            )
        return self.perm

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        shape, dtype = self.src.shape_dtype(checkpoint)
        return tuple(shape[p] for p in self._perm(len(shape))), dtype

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        array = self.src.evaluate(checkpoint)
        return np.transpose(array, self._perm(array.ndim))


@dataclass(frozen=True, eq=False)
class _Reshape(TensorExpr):
    src: TensorExpr
    shape: tuple[int, ...]

    def __repr__(self) -> str:
        return f"{self.src!r}.reshape({list(self.shape)})"

    def children(self) -> tuple[TensorExpr, ...]:
        return (self.src,)

    def _target(self, shape: Shape) -> Shape:
        size = math.prod(shape)
        if any(d < -1 for d in self.shape) or list(self.shape).count(-1) > 1:
            raise WeightPlanError(
                f"reshape target {list(self.shape)} has invalid dimensions "
                "(at most one -1, no other negatives)",
                where=repr(self),
            )
        target = self.shape
        if -1 in target:
            known = math.prod(d for d in target if d != -1)
            if known == 0 or size % known:
                raise WeightPlanError(
                    f"cannot reshape {list(shape)} ({size} elements) to {list(self.shape)}",
                    where=repr(self),
                )
            target = tuple(size // known if d == -1 else d for d in target)
        if math.prod(target) != size:
            raise WeightPlanError(
                f"cannot reshape {list(shape)} ({size} elements) to {list(self.shape)} "
                f"({math.prod(target)} elements)",
                where=repr(self),
            )
        return target

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        shape, dtype = self.src.shape_dtype(checkpoint)
        return self._target(shape), dtype

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        array = self.src.evaluate(checkpoint)
        return np.reshape(array, self._target(array.shape))


@dataclass(frozen=True, eq=False)
class _Scale(TensorExpr):
    src: TensorExpr
    factor: float

    def __repr__(self) -> str:
        return f"{self.src!r}.scale({self.factor!r})"

    def children(self) -> tuple[TensorExpr, ...]:
        return (self.src,)

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        shape, dtype = self.src.shape_dtype(checkpoint)
        if dtype not in _FLOATS:
            raise WeightPlanError(
                f"cannot scale a {dtype} tensor",
                where=repr(self),
                fix="scale only floating-point tensors (cast first)",
            )
        return shape, dtype

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        array = self.src.evaluate(checkpoint)
        compute = np.float64 if array.dtype == np.float64 else np.float32
        scaled = array.astype(compute) * compute(self.factor)
        return scaled.astype(array.dtype)


@dataclass(frozen=True, eq=False)
class _Slice(TensorExpr):
    src: TensorExpr
    axis: int
    start: int
    stop: int

    def __repr__(self) -> str:
        return f"{self.src!r}.slice({self.axis}, {self.start}, {self.stop})"

    def children(self) -> tuple[TensorExpr, ...]:
        return (self.src,)

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        shape, dtype = self.src.shape_dtype(checkpoint)
        axis = _axis(self, self.axis, len(shape))
        if not 0 <= self.start <= self.stop <= shape[axis]:
            raise WeightPlanError(
                f"slice {self.start}:{self.stop} is out of range for axis {self.axis} of "
                f"shape {list(shape)}",
                where=repr(self),
            )
        return (*shape[:axis], self.stop - self.start, *shape[axis + 1 :]), dtype

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        array = self.src.evaluate(checkpoint)
        axis = self.axis % array.ndim
        index = [slice(None)] * array.ndim
        index[axis] = slice(self.start, self.stop)
        return array[tuple(index)]


def _axis(expr: TensorExpr, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise WeightPlanError(f"axis {axis} is out of range for rank {rank}", where=repr(expr))
    return axis % rank


def ref(name: str) -> TensorExpr:
    """The checkpoint tensor ``name`` (resolved and checked at bind time)."""
    return _Ref(name)


def constant(array: np.ndarray) -> TensorExpr:
    """A tensor given by value (e.g. a computed table); the array is copied and frozen."""
    frozen = np.array(array, copy=True)
    frozen.flags.writeable = False
    return _Constant(frozen)


def concat(exprs: Sequence[TensorExpr], axis: int) -> TensorExpr:
    """Concatenate expressions along ``axis`` (e.g. fused q/k/v projections)."""
    return _Concat(tuple(exprs), int(axis))


# --------------------------------------------------------------------------- plans


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


def count_non_finite(array: np.ndarray) -> tuple[int, int]:
    """(NaN count, infinity count) of a float array, scanned in bounded chunks; (0, 0) else."""
    if array.dtype not in {NUMPY_DTYPES[f] for f in _FLOATS} or array.size == 0:
        return 0, 0
    flat = array.reshape(-1)
    nan = inf = 0
    for start in range(0, flat.size, FINITE_CHECK_CHUNK):
        chunk = flat[start : start + FINITE_CHECK_CHUNK]
        finite = np.isfinite(chunk)
        if finite.all():
            continue
        bad = int(chunk.size - np.count_nonzero(finite))
        chunk_nan = int(np.count_nonzero(np.isnan(chunk)))
        nan += chunk_nan
        inf += bad - chunk_nan
    return nan, inf


def _loader(
    expr: TensorExpr, checkpoint: Checkpoint, dtype: str, name: str, component: str
) -> Callable[[], Any]:
    np_dtype = NUMPY_DTYPES[dtype]
    ir_dtype = IR_DTYPES[dtype]
    checked = False

    def load() -> ir.Tensor:
        nonlocal checked
        array = expr.evaluate(checkpoint)
        if array.dtype != np_dtype:  # shape_dtype said so; guard against a lying constant
            array = array.astype(np_dtype)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array).reshape(array.shape)  # keeps 0-d shapes
        if not checked:  # a lazy tensor may be loaded more than once; warn once
            checked = True
            _warn_non_finite(array, expr, name, component)
        return ir.Tensor(np.asarray(array), dtype=ir_dtype, name=name)

    return load


def _warn_non_finite(array: np.ndarray, expr: TensorExpr, name: str, component: str) -> None:
    nan, inf = count_non_finite(array)
    if not nan and not inf:
        return
    sources = sorted(set(expr.refs()))
    origin = (
        f"from checkpoint tensor(s) {', '.join(map(repr, sources))}" if sources else "a constant"
    )
    found = " and ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "infinite")) if n)
    warnings.warn(
        f"initializer {name!r} of component {component!r} ({origin}, planned as {expr!r}) "
        f"holds {found} value(s) out of {array.size}; the model may produce NaN. "
        "Check the checkpoint (re-download it) or, if values overflowed a cast to float16, "
        "build with --dtype bf16 or f32",
        NonFiniteWeightWarning,
        stacklevel=2,
    )


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
    if referenced and not checkpoint.tensors:
        checkpoint.require_weights()  # explains why (pickle only, no weights) and how to fix

    problems: list[str] = []
    missing = sorted(name for name in referenced if name not in checkpoint.tensors)
    if missing:
        problems.append(f"checkpoint tensors missing ({len(missing)}): {', '.join(missing)}")
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
        if any(r not in checkpoint.tensors for r in expr.refs()):
            continue  # already reported as missing
        try:
            shape, dtype = expr.shape_dtype(checkpoint)
        except WeightPlanError as exc:
            problems.append(f"initializer {name!r}: {exc.what} in {exc.where or expr!r}")
            continue
        graph_shape = _graph_shape(init)
        if graph_shape is None:
            problems.append(f"initializer {name!r} has no static shape in the graph")
        elif graph_shape != shape:
            problems.append(
                f"initializer {name!r}: shape mismatch, planned {list(shape)} "
                f"vs graph {list(graph_shape)} ({expr!r})"
            )
        graph_dtype = _NAME_OF_IR.get(init.dtype) if init.dtype is not None else None
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
        initializers[name].const_value = ir.LazyTensor(
            _loader(expr, checkpoint, dtype, name, component),
            dtype=IR_DTYPES[dtype],
            shape=ir.Shape(shape),
            name=name,
        )
    return BindReport(
        bound=len(resolved),
        referenced=frozenset(referenced),
        ignored=MappingProxyType(dict(plan.ignored)),
        unused=tuple(sorted(set(checkpoint.tensors) - referenced - set(plan.ignored))),
    )
