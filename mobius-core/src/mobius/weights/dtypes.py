"""Dtype tables and limits shared by the weight-plan modules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

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

NAME_OF_IR = {v: k for k, v in IR_DTYPES.items()}
FLOATS = ("float32", "float16", "bfloat16", "float64")
HALF_FLOATS = ("float16", "bfloat16")

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
