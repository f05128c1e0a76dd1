"""Block quantization of weights, numpy only, packed as onnxruntime's kernels read it.

Layout (com.microsoft ``MatMulNBits`` and ``GatherBlockQuantized`` with uint8 data): a
float matrix ``W`` of ``R`` rows by ``K`` columns is cut along ``K`` into blocks of
``block_size`` values (the last block zero-padded). Each block gets one scale ``s`` and
one zero point ``z`` (``2**(bits-1)`` when symmetric, not stored), and every value
becomes ``q = clip(round(w / s) + z, 0, 2**bits - 1)``; it reads back as ``(q - z) * s``.
``packed[r, b]`` holds block ``b`` of row ``r``: 4-bit values two per byte, the even
element in the low nibble; 8-bit values one per byte. Shapes: packed
``[R, n_blocks, block_size * bits // 8]`` uint8, scales ``[R, n_blocks]`` (the
activation float type), zero points ``[R, ceil(n_blocks * bits / 8)]`` uint8 (4-bit:
two per byte, low nibble first). For ``MatMulNBits`` the rows are the output columns
``N`` (an HF ``Linear`` weight ``[out, in]`` as stored); for ``GatherBlockQuantized``
they are the table rows, so one tied table serves both ops.

Scale choice (:func:`quantize_rows`). The starting point is onnxruntime's
round-to-nearest: symmetric blocks map the value of largest magnitude to the most
negative level (``s = w_absmax_signed / -2**(bits-1)``), asymmetric blocks map
``[min(w, 0), max(w, 0)]`` onto ``[0, 2**bits - 1]``. With ``search`` (the default)
each block then tries a few multiples of that scale (``clip_ratios``: below 1 clips the
largest values, above 1 widens the range) and, for each, the least-squares scale for
the rounded levels; the block keeps whichever candidate reconstructs it with the
smallest squared error. Candidate 1.0 is round-to-nearest itself, so no block's error
is above onnxruntime's. No calibration data. (On Gaussian random weights, block 32,
the search lowers the RMS error to about 0.94x of round-to-nearest; a finer grid of
80 ratios reaches 0.941x, so a scale search alone cannot go much further.)

The lazy side: :func:`quantized` wraps a weight-plan expression giving the ``[R, K]``
rows and returns the three expressions (packed, scales, zero points) the graph
rewrite (:mod:`mobius.quantization`) plans. They share one job that reads the
source in bounded row blocks while the packed tensor streams, keeping the scales and
zero points (1/8 of the source or less) until they are written.
"""

from __future__ import annotations

import functools
import math
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mobius.errors import WeightPlanError
from mobius.records import BLOCK_SIZES
from mobius.weights.dtypes import FLOATS, NUMPY_DTYPES, Shape
from mobius.weights.expr import TensorExpr, _Cast, _Concat, _Ref, _Reshape, _Transpose

if TYPE_CHECKING:
    from mobius.checkpoint import Checkpoint

BITS = (4, 8)
"""Bit widths mobius writes (both ops' kernels take 4 and 8)."""

CLIP_RATIOS = (1.15, 1.1, 1.05, 1.0, 0.95, 0.9, 0.85, 0.8)
"""Multiples of the round-to-nearest scale tried per block by the search (1.0 is always
tried: it is the round-to-nearest scale, so no block ends worse than onnxruntime's)."""

CACHE_VALUES = 1 << 18
"""Values quantized per slice inside :func:`quantize_rows`: the search makes ~40 passes
over its slice, and a slice that stays in the L2 cache (1 MiB of float32) made the
E2B-size build's quantization 1.6x faster than whole 16 MiB row blocks (bit-identical)."""

ROW_BLOCK_BYTES = 16 * 1024 * 1024
"""float32 bytes of source rows quantized at once (bounds the scratch memory)."""

QUANT_THREADS = max(1, min(4, os.cpu_count() or 1))
"""Row blocks quantized at once (measured on 2 loaded cores: 1.35x the serial speed)."""


@dataclass(frozen=True)
class QuantizedRows:
    """What :func:`quantize_rows` returns (see the module docstring for the layout)."""

    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    correction: np.ndarray | None = None
    """``[R, n_blocks]`` in the scales' type: the constant each block adds to its
    symmetric levels' values (``QuantScheme.block_correction``), else None."""


def check_scheme(bits: int, block_size: int) -> None:
    """Raise ValueError unless ``bits`` / ``block_size`` are ones the kernels take."""
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block size must be a power of two in {BLOCK_SIZES}, got {block_size}")


def n_blocks(k: int, block_size: int) -> int:
    """Blocks per row of ``k`` values (the last one padded)."""
    return -(-k // block_size)


def zero_point_cols(nb: int, bits: int) -> int:
    """Bytes of packed zero points per row."""
    return -(-nb * bits // 8)


def quantize_rows(
    w: np.ndarray,
    *,
    bits: int = 4,
    block_size: int = 32,
    symmetric: bool = True,
    scale_dtype: Any = np.float32,
    search: bool = True,
    clip_ratios: Sequence[float] = CLIP_RATIOS,
) -> QuantizedRows:
    """Block-quantize the rows of a 2-D float array (``[R, K]``, blocks along ``K``).

    ``scale_dtype`` is the float type the scales are stored in (the activations' type);
    levels are rounded against the stored (rounded) scale.
    """
    check_scheme(bits, block_size)
    if w.ndim != 2:
        raise ValueError(f"quantize_rows needs a 2-D array, got shape {list(w.shape)}")
    rows, k = w.shape
    step = max(1, CACHE_VALUES // max(1, n_blocks(k, block_size) * block_size))
    if rows > step:  # rows are independent: quantize cache-sized slices, same bits
        parts = [
            quantize_rows(
                w[r : r + step],
                bits=bits,
                block_size=block_size,
                symmetric=symmetric,
                scale_dtype=scale_dtype,
                search=search,
                clip_ratios=clip_ratios,
            )
            for r in range(0, rows, step)
        ]
        zps = [p.zero_points for p in parts]
        return QuantizedRows(
            np.concatenate([p.packed for p in parts]),
            np.concatenate([p.scales for p in parts]),
            None if zps[0] is None else np.concatenate(zps),
        )
    nb = n_blocks(k, block_size)
    x = np.zeros((rows, nb * block_size), dtype=np.float32)
    x[:, :k] = w
    x = x.reshape(rows, nb, block_size)
    levels = (1 << bits) - 1
    ratios = (1.0, *(r for r in clip_ratios if r != 1.0)) if search else (1.0,)
    if symmetric:
        scales, q = _search_symmetric(x, bits, ratios, np.dtype(scale_dtype), refine=search)
        zp = None
    else:
        scales, q, zp_levels = _search_asymmetric(x, levels, ratios, np.dtype(scale_dtype))
        zp = pack_levels(zp_levels, bits) if bits == 4 else zp_levels
    packed = pack_levels(q.reshape(rows, nb * block_size), bits).reshape(rows, nb, -1)
    return QuantizedRows(packed, scales, zp)


def _round_scale(scale: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The scale as it will be stored, back in float32 (levels are rounded against it)."""
    if dtype == np.float32:
        return scale
    with np.errstate(over="ignore"):
        return scale.astype(dtype).astype(np.float32)


TINY_SCALE = float(1.0 / np.finfo(np.float32).max)
"""Scales below this (blocks of subnormal weights, ``|w| < ~2e-38``) have no float32
reciprocal: ``1 / scale`` overflowed to inf (numpy printed ``RuntimeWarning: overflow``)
and ``0 * inf`` made NaN levels. Such a block is given level ``zero`` everywhere, so it
reads back as exactly 0, off by at most ``2**bits * TINY_SCALE`` (~5e-38) per value."""


def _round_levels(x: np.ndarray, scale: np.ndarray, lo: float, hi: float, zero: Any = 0.0):
    """``clip(rint(x / scale) + zero, lo, hi)`` in float32, in place on a fresh array
    (a zero scale, or one below :data:`TINY_SCALE`, gives level ``zero``)."""
    usable = np.abs(scale) >= TINY_SCALE
    inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=usable)
    q = np.multiply(x, inv[..., None])
    np.rint(q, out=q)
    if not isinstance(zero, float) or zero:
        q += zero
    np.clip(q, lo, hi, out=q)
    return q


def _sq_error(sxx: np.ndarray, sxq: np.ndarray, sqq: np.ndarray, scale: np.ndarray):
    """Σ(scale·q − x)² per block from its sums Σx², Σxq, Σq² (no residual array)."""
    return sxx - 2.0 * scale * sxq + scale * scale * sqq


def _search_symmetric(
    x: np.ndarray, bits: int, ratios: Sequence[float], dtype: np.dtype, refine: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Best (scale, centred levels + 2**(bits-1)) per block: for each multiple of the
    round-to-nearest scale, the levels it rounds to and (``refine``) the least-squares
    scale of those levels (``Σxq / Σq²``, never worse for them); the block keeps the pair
    with the smallest squared error, computed from block sums."""
    mid = float(1 << (bits - 1))
    idx = np.argmax(np.abs(x), axis=-1)
    peak = np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]
    base = peak / np.float32(-mid)  # onnxruntime's round-to-nearest scale
    sxx = np.einsum("rbk,rbk->rb", x, x)
    best_scale = best_ratio = best_err = None
    for ratio in ratios:
        cand = _round_scale(base * np.float32(ratio), dtype)
        q = _round_levels(x, cand, -mid, mid - 1)
        sxq = np.einsum("rbk,rbk->rb", x, q)
        sqq = np.einsum("rbk,rbk->rb", q, q)
        if refine:
            ls = np.divide(sxq, sqq, out=np.zeros_like(sxq), where=sqq > 0)
            ls = _round_scale(ls, dtype)
            # keep the rounded candidate where the stored LS scale is not better
            err_c, err_ls = _sq_error(sxx, sxq, sqq, cand), _sq_error(sxx, sxq, sqq, ls)
            scale = np.where(err_ls < err_c, ls, cand)
            err = np.minimum(err_ls, err_c)
        else:
            scale, err = cand, _sq_error(sxx, sxq, sqq, cand)
        ratio_arr = np.full(scale.shape, ratio, np.float32)
        if best_err is None:
            best_scale, best_ratio, best_err = scale, ratio_arr, err
            continue
        better = err < best_err
        best_scale = np.where(better, scale, best_scale)
        best_ratio = np.where(better, ratio_arr, best_ratio)
        best_err = np.where(better, err, best_err)
    assert best_scale is not None and best_ratio is not None
    # the levels of the winning candidate: rounded against its ratio's scale
    q = _round_levels(x, _round_scale(base * best_ratio, dtype), -mid, mid - 1)
    q += mid
    return best_scale.astype(dtype), q.astype(np.uint8)


def _search_asymmetric(
    x: np.ndarray, top: int, ratios: Sequence[float], dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best (scale, levels, zero point) per block among ranges shrunk or widened by each
    ratio (1.0 is onnxruntime's ``[min(w, 0), max(w, 0)]`` onto ``0..top``)."""
    lo = np.minimum(x.min(axis=-1), 0.0)
    hi = np.maximum(x.max(axis=-1), 0.0)
    sxx = np.einsum("rbk,rbk->rb", x, x)
    best: tuple[np.ndarray, np.ndarray] | None = None
    best_err = None
    for ratio in ratios:
        scale = _round_scale((hi - lo) * np.float32(ratio) / top, dtype)
        safe = np.where(scale == 0, 1.0, scale)
        zp = np.clip(np.rint(-lo * np.float32(ratio) / safe), 0, top).astype(np.float32)
        q = _round_levels(x, scale, 0.0, float(top), zp[..., None])
        q -= zp[..., None]
        err = _sq_error(sxx, np.einsum("rbk,rbk->rb", x, q), np.einsum("rbk,rbk->rb", q, q), scale)
        if best is None or best_err is None:
            best, best_err = (scale, zp), err
            continue
        better = err < best_err
        best = (np.where(better, scale, best[0]), np.where(better, zp, best[1]))
        best_err = np.where(better, err, best_err)
    assert best is not None
    scale, zp = best
    q = _round_levels(x, scale, 0.0, float(top), zp[..., None])
    return scale.astype(dtype), q.astype(np.uint8), zp.astype(np.uint8)


def pack_levels(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 levels ``[R, M]`` packed along the last axis (4-bit: even value in the low nibble)."""
    values = values.astype(np.uint8)
    if bits == 8:
        return values
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], axis=-1)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def unpack_zero_points(packed: np.ndarray, nb: int, bits: int) -> np.ndarray:
    """``[R, nb]`` uint8 zero points from their packed ``[R, zp_cols]`` form."""
    if bits == 8:
        return packed[:, :nb]
    both = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    return both[:, :nb].astype(np.uint8)


def dequantize_rows(q: QuantizedRows, k: int, *, bits: int, block_size: int) -> np.ndarray:
    """The float32 ``[R, k]`` matrix ``q`` reads back as (for tests and error figures);
    float zero points (``[R, n_blocks]`` in a float type) are read unpacked."""
    rows, nb, _ = q.packed.shape
    flat = q.packed.reshape(rows, -1)
    if bits == 4:
        levels = np.stack([flat & 0x0F, flat >> 4], axis=-1).reshape(rows, -1)
    else:
        levels = flat
    levels = levels[:, : nb * block_size].reshape(rows, nb, block_size).astype(np.float32)
    if q.zero_points is None:
        zero = np.full((rows, nb), float(1 << (bits - 1)), np.float32)
    elif q.zero_points.dtype.kind == "f":
        zero = q.zero_points.reshape(rows, nb)
    else:
        zero = unpack_zero_points(q.zero_points, nb, bits)
    scales = q.scales.astype(np.float32).reshape(rows, nb)
    out = (levels - zero.astype(np.float32)[..., None]) * scales[..., None]
    if q.correction is not None:
        out += q.correction.astype(np.float32).reshape(rows, nb)[..., None]
    return out.reshape(rows, -1)[:, :k]


def quantize_experts(
    w: np.ndarray,
    *,
    bits: int = 4,
    block_size: int = 32,
    symmetric: bool = True,
    scale_dtype: Any = np.float32,
    search: bool = True,
) -> QuantizedRows:
    """Block-quantize a 3-D expert tensor ``[E, N, K]`` expert by expert (blocks along K).

    Each expert is packed exactly as a ``MatMulNBits`` weight (:func:`quantize_rows`
    of its ``[N, K]`` matrix); the results are stacked: packed ``[E, N, n_blocks,
    blob]``, scales ``[E, N, n_blocks]``, zero points ``[E, N, zp_cols]`` or None.
    This is the layout of com.microsoft ``QMoE``'s fc weights when ``K`` is the
    expert's input dimension; a routed plain-ONNX path can also slice one expert and
    feed it to ``MatMulNBits``. Memory: one expert at a time plus the outputs.
    """
    if w.ndim != 3:
        raise ValueError(f"quantize_experts needs a 3-D [E, N, K] array, got {list(w.shape)}")
    parts = [
        quantize_rows(
            w[e],
            bits=bits,
            block_size=block_size,
            symmetric=symmetric,
            scale_dtype=scale_dtype,
            search=search,
        )
        for e in range(w.shape[0])
    ]
    zps = [p.zero_points for p in parts]
    return QuantizedRows(
        np.stack([p.packed for p in parts]),
        np.stack([p.scales for p in parts]),
        None if symmetric else np.stack([z for z in zps if z is not None]),
    )


# --------------------------------------------------------------------------- lazy


def source_tensor(rows: TensorExpr) -> str | None:
    """The checkpoint tensor whose rows ``rows`` are, up to float casts and transposes
    that undo each other, or None (a computed tensor)."""
    flips, expr = 0, rows
    while not isinstance(expr, _Ref):
        if isinstance(expr, _Cast):
            expr = expr.src
        elif isinstance(expr, _Transpose) and expr.perm in (None, (1, 0)):
            flips, expr = flips + 1, expr.src
        else:
            return None
    return None if flips % 2 else expr.name


def source_tensors(rows: TensorExpr) -> list[str]:
    """Every checkpoint tensor ``rows`` reads, in order, each once (the manifest's
    ``source`` of a kept table: one name, or the tensors a table is concatenated from)."""
    return list(dict.fromkeys(rows.refs()))


Segment = tuple[str, int, int]
"""``(checkpoint tensor, first row, stop row)``: rows of a tensor with its leading axes
flattened (a ``[E, I, H]`` expert table has ``E·I`` rows of ``H``)."""


def row_segments(rows: TensorExpr, checkpoint: Any) -> list[Segment] | None:
    """Where each row of the ``[R, K]`` expression ``rows`` comes from, as runs of rows of
    checkpoint tensors in order, when ``rows`` only moves whole rows: a tensor, float
    casts, swaps of the last two axes that undo each other, reshapes that keep the row
    length, and concatenations along an axis other than the last (HF's fused
    ``gate_up_proj [E, 2I, H]`` from llama.cpp's ``[E, I, H]`` gate and up tables); None
    otherwise (a computed tensor). Shapes only: nothing is read."""
    return _segments(rows, checkpoint, flipped=False)


def _segments(expr: TensorExpr, checkpoint: Any, flipped: bool) -> list[Segment] | None:
    if isinstance(expr, _Cast):
        _, src = expr.src.shape_dtype(checkpoint)
        return _segments(expr.src, checkpoint, flipped) if src in FLOATS else None
    if isinstance(expr, _Transpose):
        rank = len(expr.src.shape_dtype(checkpoint)[0])
        if rank < 2 or expr._perm(rank) != (*range(rank - 2), rank - 1, rank - 2):
            return None
        return _segments(expr.src, checkpoint, not flipped)
    if flipped:  # an odd number of swaps: rows are columns here
        return None
    shape, _ = expr.shape_dtype(checkpoint)
    if isinstance(expr, _Ref):
        return [(expr.name, 0, math.prod(shape[:-1]))] if len(shape) >= 2 else None
    if isinstance(expr, _Reshape):
        src, _ = expr.src.shape_dtype(checkpoint)
        if len(shape) < 2 or not src or src[-1] != shape[-1]:
            return None
        return _segments(expr.src, checkpoint, False)
    if isinstance(expr, _Concat):
        axis = expr.axis % len(shape)
        if axis == len(shape) - 1:
            return None
        parts = []
        for part in expr.parts:
            segments = _segments(part, checkpoint, False)
            if segments is None:
                return None
            parts.append((segments, math.prod(part.shape_dtype(checkpoint)[0][axis:-1])))
        out: list[Segment] = []
        for outer in range(math.prod(shape[:axis])):
            for segments, inner in parts:
                out.extend(_cut(segments, outer * inner, (outer + 1) * inner))
        return out
    return None


def _cut(segments: list[Segment], first: int, stop: int) -> list[Segment]:
    """Rows ``first:stop`` of the rows ``segments`` lay out one after another."""
    out, pos = [], 0
    for name, a, b in segments:
        lo, hi = max(first, pos), min(stop, pos + b - a)
        if lo < hi:
            out.append((name, a + lo - pos, a + hi - pos))
        pos += b - a
    return out


def _stored_blocks(rows: TensorExpr, checkpoint: Any, scheme: Any, scale_dtype: np.dtype):
    """A reader ``(r0, r1) -> QuantizedRows`` of rows the checkpoint already holds
    quantized in exactly ``scheme`` (GGUF tensors whose blocks are that scheme: see
    ``GGUFCheckpoint.stored_quantized``; a table concatenated from several, by
    :func:`row_segments`), or None."""
    take = getattr(checkpoint, "stored_quantized", None)
    segments = row_segments(rows, checkpoint) if take is not None else None
    if not segments:
        return None
    readers = {}
    for name in dict.fromkeys(name for name, _, _ in segments):
        readers[name] = take(name, scheme, scale_dtype)
        if readers[name] is None:
            return None
    if len(segments) == 1:
        (name, base, _), read = segments[0], readers[segments[0][0]]
        return lambda r0, r1: read(base + r0, base + r1)

    def read_rows(r0: int, r1: int) -> QuantizedRows:
        parts = [readers[name](a, b) for name, a, b in _cut(segments, r0, r1)]
        zps, fixes = [p.zero_points for p in parts], [p.correction for p in parts]
        return QuantizedRows(
            np.concatenate([p.packed for p in parts]),
            np.concatenate([p.scales for p in parts]),
            None if zps[0] is None else np.concatenate(zps),
            None if fixes[0] is None else np.concatenate(fixes),
        )

    return read_rows


@dataclass(eq=False)
class WeightErrors:
    """The largest ``|dequantized - source|`` of the tensors quantized with this log in
    their scheme, per key (a GGUF block format approximated by ``--target cpu``)."""

    largest: dict[str, float] = field(default_factory=dict)
    tensors: dict[str, set[str]] = field(default_factory=dict)

    def record(self, key: str, tensor: str, value: float) -> None:
        self.largest[key] = max(self.largest.get(key, 0.0), value)
        self.tensors.setdefault(key, set()).add(tensor)


@dataclass(frozen=True)
class QuantScheme:
    """How one tensor is quantized: bits, block size, symmetry, scale search."""

    bits: int = 4
    block_size: int = 32
    symmetric: bool = True
    search: bool = True
    float_zero_points: bool = False
    """Zero points in the scales' float type, one per block, unpacked (MatMulNBits only;
    onnxruntime's CPU kernel takes them for 2 and 4 bits, unpacked and slow). Only a
    checkpoint's own blocks are stored so (:func:`_stored_blocks`)."""
    block_correction: bool = False
    """Symmetric levels (MatMulNBits' default zero point ``2**(bits-1)``) plus one float
    constant per block: ``w = s · (q − 2**(bits-1)) + c``, exactly a block of
    ``d · q + m`` (GGUF's Q4_1 / Q4_K, ``c = m + 2**(bits-1) · d``). The graph adds
    ``ReduceSum(x by blocks) @ C`` (``C``: ``[n_blocks, N]``) to the MatMulNBits output
    (MatMulNBits only). Only a checkpoint's own blocks are stored so."""
    errors: WeightErrors | None = field(default=None, compare=False, repr=False)
    """Where to record the largest weight error of each quantized block (under
    ``error_key``), when the error is to be reported."""
    error_key: str = ""


@dataclass(eq=False)
class _Job:
    """One source tensor being quantized: shared by its packed / scales / zero-point
    expressions so that streaming the packed tensor also yields the other two."""

    rows: TensorExpr
    scheme: QuantScheme
    cache: dict[str, np.ndarray] = field(default_factory=dict)

    def dims(self, checkpoint: Checkpoint) -> tuple[int, int, str]:
        shape, dtype = self.rows.shape_dtype(checkpoint)
        if len(shape) != 2 or dtype not in FLOATS:
            raise WeightPlanError(
                f"only 2-D float tensors can be block-quantized, got {dtype}{list(shape)}",
                where=repr(self.rows),
            )
        return shape[0], shape[1], dtype

    def row_step(self, checkpoint: Checkpoint) -> int:
        _, k, _ = self.dims(checkpoint)
        return max(1, ROW_BLOCK_BYTES // (4 * max(k, 1)))

    def row_blocks(self, checkpoint: Checkpoint, r0: int, r1: int) -> Iterator[QuantizedRows]:
        """Quantized rows ``r0:r1`` in bounded row blocks, in order; the whole source is
        read once when it cannot be streamed (a transpose), as an unquantized build would.

        Blocks are read here, one after another, and quantized on :data:`QUANT_THREADS`
        worker threads (numpy releases the GIL), at most that many blocks in flight.
        """
        _, k, dtype = self.dims(checkpoint)
        step = self.row_step(checkpoint)
        stored = _stored_blocks(self.rows, checkpoint, self.scheme, NUMPY_DTYPES[dtype])
        if stored is not None:  # already quantized in this very scheme: kept as it is
            for start in range(r0, r1, step):
                yield stored(start, min(start + step, r1))
            return
        if self.scheme.float_zero_points or self.scheme.block_correction:
            raise WeightPlanError(
                "float zero points and block corrections are only kept from a "
                "checkpoint's own blocks, and this tensor's blocks are not that scheme",
                where=repr(self.rows),
            )
        errors = self.scheme.errors
        whole = None if self.rows._streamable(checkpoint) else self.rows.evaluate(checkpoint)
        quantize = functools.partial(
            quantize_rows,
            bits=self.scheme.bits,
            block_size=self.scheme.block_size,
            symmetric=self.scheme.symmetric,
            scale_dtype=NUMPY_DTYPES[dtype],
            search=self.scheme.search,
        )

        def done(item: tuple[Future[QuantizedRows], np.ndarray]) -> QuantizedRows:
            q = item[0].result()
            if errors is not None:
                s = self.scheme
                back = dequantize_rows(q, k, bits=s.bits, block_size=s.block_size)
                delta = float(np.abs(back - item[1]).max(initial=0.0))
                errors.record(s.error_key, source_tensor(self.rows) or repr(self.rows), delta)
            return q

        with ThreadPoolExecutor(QUANT_THREADS, thread_name_prefix="mobius-quant") as pool:
            pending: deque[tuple[Future[QuantizedRows], np.ndarray]] = deque()
            for start in range(r0, r1, step):
                stop = min(start + step, r1)
                if whole is not None:
                    block = whole[start:stop]
                else:
                    pieces = list(self.rows._stream(checkpoint, start * k, stop * k, step * k))
                    block = np.concatenate(pieces).reshape(stop - start, k)
                pending.append((pool.submit(quantize, block), block))
                if len(pending) >= QUANT_THREADS:
                    yield done(pending.popleft())
            while pending:
                yield done(pending.popleft())

    def side_outputs(self, checkpoint: Checkpoint, part: str) -> dict[str, np.ndarray]:
        """Scales, zero points, corrections: kept by a finished packed stream (or an
        earlier pass) until written, else computed by a pass over the rows."""
        if part not in self.cache:
            self._collect(checkpoint, self.row_blocks(checkpoint, 0, self.dims(checkpoint)[0]))
        return self.cache

    def _collect(self, checkpoint: Checkpoint, blocks: Iterator[QuantizedRows]) -> None:
        scales, zps, fixes = [], [], []
        for q in blocks:
            scales.append(q.scales)
            if q.zero_points is not None:
                zps.append(q.zero_points)
            if q.correction is not None:
                fixes.append(q.correction)
        self.keep(scales, zps, fixes)

    def keep(
        self, scales: list[np.ndarray], zps: list[np.ndarray], fixes: Sequence[np.ndarray] = ()
    ) -> None:
        """Store the side outputs of a full pass until they are written (the block
        corrections as MatMul's ``[n_blocks, N]``)."""
        self.cache["scales"] = np.concatenate(scales)
        if fixes:
            self.cache["correction"] = np.ascontiguousarray(np.concatenate(fixes).T)
        if zps:
            packed = np.concatenate(zps)
            self.cache["zero_points"] = packed
            if self.scheme.float_zero_points:  # MatMulNBits only: no gather form
                return
            nb = self.cache["scales"].shape[1]
            self.cache["gather_zero_points"] = unpack_zero_points(
                packed, nb, self.scheme.bits
            ).reshape(-1, nb, 1)


@dataclass(frozen=True, eq=False)
class _QuantPart(TensorExpr):
    """One output of a quantize job: ``packed``, ``scales`` or ``zero_points``."""

    job: _Job
    part: str

    def __repr__(self) -> str:
        s = self.job.scheme
        sym = "float-zp" if s.float_zero_points else "sym" if s.symmetric else "asym"
        sym += "+block-correction" if s.block_correction else ""
        how = "" if s.search else ", rtn"  # the scale choice changes the bytes
        return f"{self.job.rows!r}.quantize(int{s.bits}, {s.block_size}, {sym}{how}).{self.part}"

    def children(self) -> tuple[TensorExpr, ...]:
        return (self.job.rows,)

    def shape_dtype(self, checkpoint: Checkpoint) -> tuple[Shape, str]:
        rows, k, dtype = self.job.dims(checkpoint)
        s = self.job.scheme
        nb = n_blocks(k, s.block_size)
        if self.part == "packed":
            return (rows, nb, s.block_size * s.bits // 8), "uint8"
        if self.part == "scales":
            return (rows, nb), dtype
        if self.part == "gather_zero_points":
            return (rows, nb, 1), "uint8"
        if self.part == "correction":
            return (nb, rows), dtype
        if s.float_zero_points:
            return (rows, nb), dtype
        return (rows, zero_point_cols(nb, s.bits)), "uint8"

    def _widest(self, checkpoint: Checkpoint) -> int:
        return 4

    def _evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        if self.part == "packed":
            shape, _ = self.shape_dtype(checkpoint)
            out = np.empty(shape, np.uint8)
            flat = out.reshape(-1)
            pos = 0
            for chunk in self._stream(checkpoint, 0, flat.size, flat.size or 1):
                flat[pos : pos + chunk.size] = chunk
                pos += chunk.size
            return out
        return self.job.side_outputs(checkpoint, self.part).pop(self.part)

    def evaluate(self, checkpoint: Checkpoint) -> np.ndarray:
        return self._evaluate(checkpoint)

    def _streamable(self, checkpoint: Checkpoint) -> bool:
        return self.part == "packed"

    def _stream(
        self, checkpoint: Checkpoint, begin: int, end: int, step: int
    ) -> Iterator[np.ndarray]:
        shape, _ = self.shape_dtype(checkpoint)
        row_bytes = math.prod(shape[1:])
        if row_bytes == 0 or begin >= end:
            return
        r0, r1 = begin // row_bytes, -(-end // row_bytes)
        whole = begin == 0 and end == math.prod(shape)
        scales, zps, fixes = [], [], []
        pos = r0 * row_bytes
        for q in self.job.row_blocks(checkpoint, r0, r1):
            flat = q.packed.reshape(-1)
            lo, hi = max(begin - pos, 0), min(end - pos, flat.size)
            for at in range(lo, hi, step):
                yield flat[at : min(at + step, hi)]
            pos += flat.size
            if whole:
                scales.append(q.scales)
                if q.zero_points is not None:
                    zps.append(q.zero_points)
                if q.correction is not None:
                    fixes.append(q.correction)
        if whole:  # the full stream also produced the side outputs: keep them
            self.job.keep(scales, zps, fixes)


@dataclass(frozen=True)
class QuantizedExprs:
    """The lazy outputs of quantizing one tensor (:func:`quantized`)."""

    packed: TensorExpr
    """``[R, n_blocks, blob]`` uint8."""
    scales: TensorExpr
    """``[R, n_blocks]`` in the source's float type."""
    zero_points: TensorExpr | None
    """``[R, ceil(n_blocks * bits / 8)]`` uint8 (MatMulNBits), None when symmetric."""
    gather_zero_points: TensorExpr | None
    """``[R, n_blocks, 1]`` uint8, one per byte (GatherBlockQuantized), None when symmetric."""
    correction: TensorExpr | None = None
    """``[n_blocks, R]`` in the source's float type (``QuantScheme.block_correction``:
    the ``C`` of ``ReduceSum(x by blocks) @ C``), else None."""


def quantized(rows: TensorExpr, scheme: QuantScheme) -> QuantizedExprs:
    """The lazy quantize step of the ``[R, K]`` rows ``rows`` (nothing read here).

    A ``x.transpose()`` of a 2-D ``x`` (how a plan turns an HF ``Linear`` weight into a
    MatMul's ``[K, N]``) is undone by the caller (:func:`rows_of_matmul_weight`), so
    the rows stream straight from the checkpoint.
    """
    check_scheme(scheme.bits, scheme.block_size)
    job = _Job(rows, scheme)
    asym = not scheme.symmetric or scheme.float_zero_points
    return QuantizedExprs(
        _QuantPart(job, "packed"),
        _QuantPart(job, "scales"),
        _QuantPart(job, "zero_points") if asym else None,
        _QuantPart(job, "gather_zero_points") if asym and not scheme.float_zero_points else None,
        _QuantPart(job, "correction") if scheme.block_correction else None,
    )


def rows_of_matmul_weight(expr: TensorExpr, *, experts: bool = False) -> TensorExpr:
    """The ``[N, K]`` rows of a planned MatMul B ``[K, N]``: ``x`` for ``x.transpose()``.

    ``experts``: the same per expert for a stacked ``[E, K, N]`` table (``[E, N, K]``).
    """
    swap = (0, 2, 1) if experts else (1, 0)

    def swaps(e: TensorExpr) -> bool:
        return isinstance(e, _Transpose) and (e.perm == swap or (not experts and e.perm is None))

    if swaps(expr):
        return expr.src  # type: ignore[attr-defined]
    if isinstance(expr, _Cast) and swaps(expr.src):  # hf_linear: x.transpose().cast(dtype)
        return _Cast(expr.src.src, expr.dtype)  # type: ignore[attr-defined]
    return expr.transpose(list(swap))
