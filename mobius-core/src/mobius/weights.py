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
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

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

CHUNK_BYTES = 64 * 1024 * 1024
"""Default bound of one chunk of :meth:`TensorExpr.iter_chunks` (and of its read buffer)."""


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
    reads data (plain file reads, never a memory map) and computes the whole result,
    :meth:`iter_chunks` computes it piece by piece when the expression allows it.

    Streaming model: a *streamable* expression's output, flattened in C order, is a
    function of a contiguous element range of each of its sources, element by element
    or range by range (:meth:`_stream` yields any range ``[begin, end)`` of it).
    """

    @abstractmethod
    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        """Output shape and mobius dtype name, from headers only; WeightPlanError if invalid."""

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        """Compute the whole tensor into a fresh array (checkpoint data by plain reads).

        Streamable expressions that read or make more than :data:`CHUNK_BYTES` are
        filled chunk by chunk into one output array, so a slice reads only its rows and
        a cast never holds a second full-size copy.
        """
        shape, dtype = self.shape_dtype(checkpoint)
        out_bytes = math.prod(shape) * NUMPY_DTYPES[dtype].itemsize
        in_bytes = sum(checkpoint.tensors[name].nbytes for name in set(self.refs()))
        if max(out_bytes, in_bytes) <= CHUNK_BYTES or not self._streamable(checkpoint):
            return self._evaluate(checkpoint)  # small: whole reads cost no more memory
        out = np.empty(shape, dtype=NUMPY_DTYPES[dtype])
        flat = out.reshape(-1)
        pos = 0
        for chunk in self._stream(checkpoint, 0, flat.size, self._step(checkpoint, CHUNK_BYTES)):
            flat[pos : pos + chunk.size] = chunk
            pos += chunk.size
        return out

    @abstractmethod
    def _evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        """Compute the whole tensor from the children's :meth:`evaluate` results."""

    def iter_chunks(
        self, checkpoint: Checkpoint, max_bytes: int = CHUNK_BYTES
    ) -> Iterator[np.ndarray] | None:
        """The result as consecutive 1-D chunks (C order), or None when not streamable.

        Each chunk is a 1-D numpy array of the output dtype of at most ``max_bytes``
        bytes (at least one element); concatenated they equal ``evaluate(...)
        .reshape(-1)``. A chunk may be a view of a buffer the next chunk reuses: use
        (write, hash, scan) it before advancing the iterator. Every buffer the stream
        allocates is bounded by ``max_bytes`` too, so memory stays O(max_bytes)
        whatever the tensor's size. Streamable: :func:`ref`, :func:`constant`,
        ``cast``, ``scale``, ``reshape``, and ``slice`` / :func:`concat` along an axis
        with only size-1 axes before it (axis 0, typically), over streamable sources.
        ``transpose`` is not (return None; use :meth:`evaluate`).
        """
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        if not self._streamable(checkpoint):
            return None
        shape, _ = self.shape_dtype(checkpoint)
        return self._stream(checkpoint, 0, math.prod(shape), self._step(checkpoint, max_bytes))

    def _streamable(self, checkpoint: Checkpoint) -> bool:
        """Whether :meth:`_stream` works for this expression (default: no)."""
        return False

    def _stream(
        self, checkpoint: Checkpoint, begin: int, end: int, step: int
    ) -> Iterator[np.ndarray]:
        """Flat elements ``begin:end`` of the result, in 1-D pieces of at most ``step``."""
        raise TypeError(f"{self!r} cannot be streamed")  # guarded by _streamable

    def _widest(self, checkpoint: Checkpoint) -> int:
        """Largest bytes per element any node of the tree holds (float32 scratch included)."""
        _, dtype = self.shape_dtype(checkpoint)
        width = NUMPY_DTYPES[dtype].itemsize
        return max([width, *(child._widest(checkpoint) for child in self.children())])

    def _step(self, checkpoint: Checkpoint, max_bytes: int) -> int:
        """Elements per chunk so that no buffer of the stream exceeds ``max_bytes``."""
        return max(1, max_bytes // self._widest(checkpoint))

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

    def _evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        return checkpoint.read(self.name)

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        return checkpoint.read(self.name)  # one read straight into the result

    def _streamable(self, checkpoint: Checkpoint) -> bool:
        return True

    def _stream(
        self, checkpoint: Checkpoint, begin: int, end: int, step: int
    ) -> Iterator[np.ndarray]:
        return checkpoint.read_chunks(self.name, begin, end, step)


@dataclass(frozen=True, eq=False)
class _Constant(TensorExpr):
    array: np.ndarray

    def __repr__(self) -> str:
        return f"constant({self.array.dtype}{list(self.array.shape)})"

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        return tuple(self.array.shape), _dtype_name_of_numpy(self.array.dtype)

    def _evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        return self.array

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        return self.array  # frozen (read-only) already: no copy

    def _streamable(self, checkpoint: Checkpoint) -> bool:
        return True

    def _stream(
        self, checkpoint: Checkpoint, begin: int, end: int, step: int
    ) -> Iterator[np.ndarray]:
        flat = self.array.reshape(-1)
        for pos in range(begin, end, step):
            yield flat[pos : min(pos + step, end)]


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

    def _evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        arrays = [p.evaluate(checkpoint) for p in self.parts]
        return np.concatenate(arrays, axis=self.axis)

    def _streamable(self, checkpoint: Checkpoint) -> bool:
        shape, _ = self.shape_dtype(checkpoint)
        axis = _axis(self, self.axis, len(shape))
        outer = math.prod(shape[:axis])  # 1: the parts lie one after another in C order
        return outer == 1 and all(p._streamable(checkpoint) for p in self.parts)

    def _stream(
        self, checkpoint: Checkpoint, begin: int, end: int, step: int
    ) -> Iterator[np.ndarray]:
        offset = 0
        for part in self.parts:
            size = math.prod(part.shape_dtype(checkpoint)[0])
            lo, hi = max(begin, offset), min(end, offset + size)
            if lo < hi:
                yield from part._stream(checkpoint, lo - offset, hi - offset, step)
            offset += size


class _Unary(TensorExpr):
    """A transform of one source expression, ``src`` (a dataclass field of each subclass)."""

    src: TensorExpr

    def children(self) -> tuple[TensorExpr, ...]:
        return (self.src,)


class _Elementwise(_Unary):
    """A transform applied element by element: it streams wherever its source does."""

    @abstractmethod
    def _apply(self, array: np.ndarray) -> np.ndarray:
        """The transform itself, shared by whole evaluation and by every streamed chunk."""

    def _evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        return self._apply(self.src.evaluate(checkpoint))

    def _streamable(self, checkpoint: Checkpoint) -> bool:
        return self.src._streamable(checkpoint)

    def _stream(
        self, checkpoint: Checkpoint, begin: int, end: int, step: int
    ) -> Iterator[np.ndarray]:
        for chunk in self.src._stream(checkpoint, begin, end, step):
            yield self._apply(chunk)


@dataclass(frozen=True, eq=False)
class _Cast(_Elementwise):
    src: TensorExpr
    dtype: str

    def __repr__(self) -> str:
        return f"{self.src!r}.cast({self.dtype!r})"

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

    def _apply(self, array: np.ndarray) -> np.ndarray:
        target = NUMPY_DTYPES[self.dtype]
        if array.dtype == target:
            return array
        if array.dtype == NUMPY_DTYPES["bfloat16"] and target != NUMPY_DTYPES["float32"]:
            array = array.astype(np.float32)  # ml_dtypes casts exactly through float32
        with np.errstate(over="ignore"):  # overflow to inf is reported by the finite check
            return array.astype(target)

    def _widest(self, checkpoint: Checkpoint) -> int:
        _, src = self.src.shape_dtype(checkpoint)
        scratch = 4 if src == "bfloat16" and self.dtype != src else 0  # via float32
        return max(scratch, super()._widest(checkpoint))


@dataclass(frozen=True, eq=False)
class _Transpose(_Unary):
    src: TensorExpr
    perm: tuple[int, ...] | None

    def __repr__(self) -> str:
        return f"{self.src!r}.transpose({'' if self.perm is None else list(self.perm)})"

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

    def _evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        array = self.src.evaluate(checkpoint)
        perm = self._perm(array.ndim)
        rank = array.ndim
        swaps_last_two = rank >= 2 and perm == (*range(rank - 2), rank - 1, rank - 2)
        if swaps_last_two and array.size and array.dtype.itemsize in _UINT_OF_SIZE:
            return _swap_last_two(array)
        return np.transpose(array, perm)


@dataclass(frozen=True, eq=False)
class _Reshape(_Unary):
    src: TensorExpr
    shape: tuple[int, ...]

    def __repr__(self) -> str:
        return f"{self.src!r}.reshape({list(self.shape)})"

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

    def _evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        array = self.src.evaluate(checkpoint)
        return np.reshape(array, self._target(array.shape))

    def _streamable(self, checkpoint: Checkpoint) -> bool:
        return self.src._streamable(checkpoint)  # C order is unchanged by a reshape

    def _stream(
        self, checkpoint: Checkpoint, begin: int, end: int, step: int
    ) -> Iterator[np.ndarray]:
        return self.src._stream(checkpoint, begin, end, step)


@dataclass(frozen=True, eq=False)
class _Scale(_Elementwise):
    src: TensorExpr
    factor: float

    def __repr__(self) -> str:
        return f"{self.src!r}.scale({self.factor!r})"

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        shape, dtype = self.src.shape_dtype(checkpoint)
        if dtype not in _FLOATS:
            raise WeightPlanError(
                f"cannot scale a {dtype} tensor",
                where=repr(self),
                fix="scale only floating-point tensors (cast first)",
            )
        return shape, dtype

    def _apply(self, array: np.ndarray) -> np.ndarray:
        compute = np.float64 if array.dtype == np.float64 else np.float32
        scaled = array.astype(compute) * compute(self.factor)
        return scaled.astype(array.dtype)

    def _widest(self, checkpoint: Checkpoint) -> int:
        return max(4, super()._widest(checkpoint))  # float32 scratch


@dataclass(frozen=True, eq=False)
class _Slice(_Unary):
    src: TensorExpr
    axis: int
    start: int
    stop: int

    def __repr__(self) -> str:
        return f"{self.src!r}.slice({self.axis}, {self.start}, {self.stop})"

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

    def _evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        array = self.src.evaluate(checkpoint)
        axis = self.axis % array.ndim
        index = [slice(None)] * array.ndim
        index[axis] = slice(self.start, self.stop)
        return array[tuple(index)]

    def _streamable(self, checkpoint: Checkpoint) -> bool:
        shape, _ = self.src.shape_dtype(checkpoint)
        axis = _axis(self, self.axis, len(shape))
        # Only size-1 axes before ``axis``: the kept rows are one contiguous range.
        return math.prod(shape[:axis]) == 1 and self.src._streamable(checkpoint)

    def _stream(
        self, checkpoint: Checkpoint, begin: int, end: int, step: int
    ) -> Iterator[np.ndarray]:
        shape, _ = self.src.shape_dtype(checkpoint)
        axis = _axis(self, self.axis, len(shape))
        first = self.start * math.prod(shape[axis + 1 :])
        return self.src._stream(checkpoint, first + begin, first + end, step)


_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_TRANSPOSE_TILE = (256, 512)
"""Rows x columns of the source copied per step by :func:`_swap_last_two` (cache and TLB sized)."""


def _swap_last_two(array: np.ndarray) -> np.ndarray:
    """``array`` with its last two axes swapped, as a new C-contiguous array.

    Why not ``np.ascontiguousarray(array.T)``: that copy walks the source with a
    large stride and misses the cache on every element (and for ml_dtypes' bfloat16
    it is slower still); copying tiles moves the same bits 4-6x faster. The
    bits are copied through an unsigned integer view of the same width.
    """
    uint = _UINT_OF_SIZE[array.dtype.itemsize]
    src = np.ascontiguousarray(array).view(uint)
    out = np.empty((*src.shape[:-2], src.shape[-1], src.shape[-2]), dtype=uint)
    rows, cols = src.shape[-2:]
    step_r, step_c = _TRANSPOSE_TILE
    for lead, dest in zip(src.reshape(-1, rows, cols), out.reshape(-1, cols, rows)):
        for i in range(0, rows, step_r):
            block = lead[i : i + step_r]
            for j in range(0, cols, step_c):
                dest[j : j + step_c, i : i + step_r] = block[:, j : j + step_c].T
    return out.view(array.dtype)


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


_HALF_INF_BITS = {NUMPY_DTYPES["bfloat16"]: 0x7F80, NUMPY_DTYPES["float16"]: 0x7C00}
"""Bit pattern of +infinity of each 16-bit float; larger magnitudes (sign cleared) are NaN."""


def count_non_finite(array: np.ndarray) -> tuple[int, int]:
    """(NaN count, infinity count) of a float array, scanned in bounded chunks; (0, 0) else."""
    if array.dtype not in {NUMPY_DTYPES[f] for f in _FLOATS} or array.size == 0:
        return 0, 0
    flat = array.reshape(-1)
    if array.dtype in _HALF_INF_BITS:
        return _count_non_finite_half(flat, _HALF_INF_BITS[array.dtype])
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


def _count_non_finite_half(flat: np.ndarray, inf_bits: int) -> tuple[int, int]:
    """count_non_finite of a 16-bit float array by its bits (ml_dtypes' bfloat16
    ``isfinite`` is a slow generic loop): magnitude == inf bits is infinite, above is NaN."""
    bits = flat.view(np.uint16)
    scratch = np.empty(min(bits.size, FINITE_CHECK_CHUNK), dtype=np.uint16)
    nan = inf = 0
    for start in range(0, bits.size, FINITE_CHECK_CHUNK):
        chunk = bits[start : start + FINITE_CHECK_CHUNK]
        magnitude = np.bitwise_and(chunk, 0x7FFF, out=scratch[: chunk.size])
        if magnitude.max() < inf_bits:
            continue
        inf += int(np.count_nonzero(magnitude == inf_bits))
        nan += int(np.count_nonzero(magnitude > inf_bits))
    return nan, inf


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

    def _warn(self, nan: int, inf: int, size: int) -> None:
        _warn_non_finite(nan, inf, size, self.expr, self.name or "", self.component)


def _warn_non_finite(
    nan: int, inf: int, size: int, expr: TensorExpr, name: str, component: str
) -> None:
    if not nan and not inf:
        return
    sources = sorted(set(expr.refs()))
    origin = (
        f"from checkpoint tensor(s) {', '.join(map(repr, sources))}" if sources else "a constant"
    )
    found = " and ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "infinite")) if n)
    warnings.warn(
        f"initializer {name!r} of component {component!r} ({origin}, planned as {expr!r}) "
        f"holds {found} value(s) out of {size}; the model may produce NaN. "
        "Check the checkpoint (re-download it) or, if values overflowed a cast to float16, "
        "build with --dtype bf16 or f32",
        NonFiniteWeightWarning,
        stacklevel=3,
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
        initializers[name].const_value = PlannedTensor(
            expr, checkpoint, dtype, shape, name=name, component=component
        )
    return BindReport(
        bound=len(resolved),
        referenced=frozenset(referenced),
        ignored=MappingProxyType(dict(plan.ignored)),
        unused=tuple(sorted(set(checkpoint.tensors) - referenced - set(plan.ignored))),
    )
