"""Port dtype names (``"float32"``, …) and their onnx_ir ``DataType``.

Contracts, weight casts and build options speak in short string names so that a
manifest stays plain JSON; graphs speak ``onnx_ir.DataType``. This module is the
one place the two meet. It imports only onnx_ir so contract validation can use it
without pulling in onnxscript.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius.errors import MobiusError

_NAME_TO_IR: dict[str, ir.DataType] = {
    "float32": ir.DataType.FLOAT,
    "float16": ir.DataType.FLOAT16,
    "bfloat16": ir.DataType.BFLOAT16,
    "int64": ir.DataType.INT64,
    "int32": ir.DataType.INT32,
    "bool": ir.DataType.BOOL,
    "uint8": ir.DataType.UINT8,
}
_IR_TO_NAME: dict[ir.DataType, str] = {v: k for k, v in _NAME_TO_IR.items()}

_BUILD_DTYPES: dict[str, str] = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}

DTYPE_NAMES: tuple[str, ...] = tuple(_NAME_TO_IR)
"""Every port dtype name mobius knows."""


def ir_dtype(dtype: str | ir.DataType) -> ir.DataType:
    """Return the ``ir.DataType`` for a port dtype name or build dtype (``"f16"``)."""
    if isinstance(dtype, ir.DataType):
        return dtype
    name = _BUILD_DTYPES.get(dtype, dtype)
    if name not in _NAME_TO_IR:
        raise MobiusError(
            f"unknown dtype {dtype!r}",
            fix=f"use one of {', '.join(DTYPE_NAMES)} (or build dtypes f32/f16/bf16)",
        )
    return _NAME_TO_IR[name]


def dtype_name(dtype: ir.DataType | None) -> str:
    """Return the port dtype name of an ``ir.DataType`` (its ONNX name if mobius has none)."""
    if dtype is None:
        return "unknown"
    return _IR_TO_NAME.get(dtype, dtype.name.lower())


def numpy_dtype(dtype: str | ir.DataType) -> np.dtype:
    """The numpy dtype for a port dtype (bfloat16 via ``ml_dtypes``)."""
    dt = ir_dtype(dtype)
    if dt == ir.DataType.BFLOAT16:
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dt.numpy())
