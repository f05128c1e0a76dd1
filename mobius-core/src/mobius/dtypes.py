"""The one dtype table of mobius: every dtype name, its ONNX code, which are port and
build dtypes.

Contracts, weight plans and build options speak in short string names (``"float32"``,
build dtypes ``"f16"``) so that a manifest stays plain JSON; graphs speak
``onnx_ir.DataType`` and weights numpy dtypes. Everything that maps between them is
derived from :data:`DTYPES` here: :mod:`mobius.components.dtypes` (``ir_dtype`` /
``dtype_name`` / ``numpy_dtype``), :mod:`mobius.weights.dtypes` (the weight-plan
tables), :data:`mobius.contract.DTYPES` and :data:`mobius.records.PORT_DTYPE_OF_BUILD_DTYPE`.
Importing it loads no onnx_ir or numpy (the converters import them when called), so
records and contract validation import it freely.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

DTYPES: dict[str, int] = {
    "float32": 1,
    "float16": 10,
    "bfloat16": 16,
    "float64": 11,
    "int64": 7,
    "int32": 6,
    "int16": 5,
    "int8": 3,
    "uint8": 2,
    "bool": 9,
}
"""Every dtype name mobius knows → its ONNX ``TensorProto`` data type code."""

PORT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "int64", "int32", "bool", "uint8")
"""The dtypes a contract port may have (a subset of :data:`DTYPES`)."""

FLOATS: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")
HALF_FLOATS: tuple[str, ...] = ("float16", "bfloat16")

BUILD_DTYPES: dict[str, str] = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
"""``mobius build --dtype`` values → the port dtype of the float tensors they produce."""


def ir_dtype(dtype: str | ir.DataType) -> ir.DataType:
    """The ``onnx_ir.DataType`` of a dtype name or build dtype (``"f16"``)."""
    import onnx_ir as ir

    if isinstance(dtype, ir.DataType):
        return dtype
    name = BUILD_DTYPES.get(dtype, dtype)
    if name not in DTYPES:
        from mobius.errors import MobiusError

        raise MobiusError(
            f"unknown dtype {dtype!r}",
            fix=f"use one of {', '.join(DTYPES)} (or build dtypes f32/f16/bf16)",
        )
    return ir.DataType(DTYPES[name])


def dtype_name(dtype: ir.DataType | None) -> str:
    """The dtype name of an ``ir.DataType`` (its ONNX name if mobius has none)."""
    if dtype is None:
        return "unknown"
    return _NAME_OF_CODE.get(int(dtype), dtype.name.lower())


def numpy_dtype(dtype: str | ir.DataType) -> np.dtype:
    """The numpy dtype of a dtype name or ``ir.DataType`` (bfloat16 via ``ml_dtypes``)."""
    import ml_dtypes
    import numpy as np

    dt = ir_dtype(dtype)
    if dt.name == "BFLOAT16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dt.numpy())


_NAME_OF_CODE = {code: name for name, code in DTYPES.items()}
