"""The lazy tensor expression tree of weight plans: :func:`ref`, :func:`constant`,
:func:`concat` and the chainable transforms of :class:`TensorExpr` (cast, transpose,
reshape, scale, slice), each computable whole or streamed in bounded chunks."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mobius.errors import WeightPlanError
from mobius.weights.dtypes import CHUNK_BYTES, FLOATS, NUMPY_DTYPES, Shape, cast_problem

if TYPE_CHECKING:
    from mobius.checkpoint import Checkpoint


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
        if dtype not in FLOATS:
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
