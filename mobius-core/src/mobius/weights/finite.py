"""NaN / infinity checks of materialized initializers (see :class:`NonFiniteWeightWarning`)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from mobius.weights.dtypes import FLOATS, NUMPY_DTYPES

if TYPE_CHECKING:
    from mobius.weights.expr import TensorExpr


FINITE_CHECK_CHUNK = 1 << 22
"""Elements scanned per ``np.isfinite`` call, so the check's scratch memory stays small."""


class NonFiniteWeightWarning(UserWarning):
    """An initializer holds NaN or infinite values (after its weight-plan transforms)."""


_HALF_INF_BITS = {NUMPY_DTYPES["bfloat16"]: 0x7F80, NUMPY_DTYPES["float16"]: 0x7C00}
"""Bit pattern of +infinity of each 16-bit float; larger magnitudes (sign cleared) are NaN."""


def count_non_finite(array: np.ndarray) -> tuple[int, int]:
    """(NaN count, infinity count) of a float array, scanned in bounded chunks; (0, 0) else."""
    if array.dtype not in {NUMPY_DTYPES[f] for f in FLOATS} or array.size == 0:
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


def warn_non_finite(
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
