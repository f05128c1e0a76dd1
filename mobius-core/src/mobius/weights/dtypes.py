"""Dtype tables and limits shared by the weight-plan modules (views of
:data:`mobius.dtypes.DTYPES`, the one table)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius.dtypes import DTYPES, FLOATS, HALF_FLOATS, ir_dtype, numpy_dtype

__all__ = ["FLOATS", "HALF_FLOATS", "IR_DTYPES", "NAME_OF_IR", "NUMPY_DTYPES", "cast_problem"]

NUMPY_DTYPES: dict[str, np.dtype] = {name: numpy_dtype(name) for name in DTYPES}
"""numpy dtype of each mobius dtype name a weight plan may produce."""

IR_DTYPES: dict[str, ir.DataType] = {name: ir_dtype(name) for name in DTYPES}
"""onnx_ir data type of each mobius dtype name."""

NAME_OF_IR = {v: k for k, v in IR_DTYPES.items()}

CHUNK_BYTES = 64 * 1024 * 1024
"""Default bound of one chunk of :meth:`TensorExpr.iter_chunks` (and of its read buffer)."""


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
    if src in FLOATS:
        return None if dst in FLOATS else f"casting {src} to {dst} would truncate the values"
    if dst == "bool":
        return f"casting {src} to bool would collapse the values to 0/1"
    if dst in HALF_FLOATS:
        return f"{src} data cannot be cast to {dst} without losing values"
    return None


Shape = tuple[int, ...]
