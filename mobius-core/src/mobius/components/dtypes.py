"""Dtype names (``"float32"``, build dtypes ``"f16"``) as onnx_ir ``DataType`` and numpy
dtypes: the converters of :mod:`mobius.dtypes` (the one table), importable from here too.
"""

from __future__ import annotations

from mobius.dtypes import PORT_DTYPES, dtype_name, ir_dtype, numpy_dtype

DTYPE_NAMES: tuple[str, ...] = PORT_DTYPES
"""Every port dtype name (:data:`mobius.dtypes.PORT_DTYPES`)."""

__all__ = ["DTYPE_NAMES", "dtype_name", "ir_dtype", "numpy_dtype"]
