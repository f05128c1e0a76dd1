"""Small graph pieces the Gemma 4 vision and audio towers share.

``ClippableLinear`` mirrors HF ``Gemma4ClippableLinear``: when a tower is
configured with ``use_clipped_linears`` the checkpoint carries four scalar
bounds per linear (``input_min/max``, ``output_min/max``) that clamp the input
and the output. They are graph initializers here (shape ``[]``), bound from the
checkpoint like any weight, so one graph serves every checkpoint of a size.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype

F32 = ir.DataType.FLOAT
BOOL = ir.DataType.BOOL
INT64 = ir.DataType.INT64


class ClippableLinear(nn.Module):
    """``clip(clip(x, in_min, in_max) @ W, out_min, out_max)``; plain ``x @ W`` when not clipped.

    Parameters: ``weight`` ``[in, out]`` and, when ``clipped``, the scalar bounds
    ``input_min``, ``input_max``, ``output_min``, ``output_max`` (shape ``[]``).
    """

    def __init__(self, in_features: int, out_features: int, clipped: bool, *, dtype: str) -> None:
        super().__init__()
        dt = ir_dtype(dtype)
        self.weight = nn.Parameter([in_features, out_features], dtype=dt)
        self.clipped = clipped
        if clipped:
            self.input_min = nn.Parameter([], dtype=dt)
            self.input_max = nn.Parameter([], dtype=dt)
            self.output_min = nn.Parameter([], dtype=dt)
            self.output_max = nn.Parameter([], dtype=dt)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        if self.clipped:
            x = op.Clip(x, self.input_min, self.input_max)
        y = op.MatMul(x, self.weight)
        if self.clipped:
            y = op.Clip(y, self.output_min, self.output_max)
        return y


def gelu_tanh(op: OpBuilder, x: ir.Value) -> ir.Value:
    """GELU with the tanh approximation (HF ``gelu_pytorch_tanh``)."""
    return op.Gelu(x, approximate="tanh")


def gelu_exact(op: OpBuilder, x: ir.Value) -> ir.Value:
    """Exact (erf) GELU (HF ``gelu``)."""
    return op.Gelu(x)


ACTIVATIONS = {"gelu_pytorch_tanh": gelu_tanh, "gelu": gelu_exact}


def rms_norm_f32(
    op: OpBuilder, x: ir.Value, eps: float, weight: ir.Value | None = None
) -> ir.Value:
    """HF ``Gemma4RMSNorm`` in primitive ops: f32 statistics, ``x · (mean(x²) + eps)^-0.5 (· w)``.

    Written out (Pow −0.5 like HF) rather than as ``RMSNormalization`` so onnxruntime
    cannot fuse it with a neighbouring bias into a kernel some EPs reject (docs/gemma4.md §9).
    """
    x32 = op.Cast(x, to=F32)
    ms = op.Add(op.ReduceMean(op.Mul(x32, x32), [-1], keepdims=1), op.Constant(value_float=eps))
    y = op.Mul(x32, op.Pow(ms, op.Constant(value_float=-0.5)))
    if weight is not None:
        y = op.Mul(y, op.Cast(weight, to=F32))
    return op.CastLike(y, x)


class Norm(nn.Module):
    """RMSNorm with a learned weight (``weight`` ``[dim]``), f32 statistics, output in x's dtype."""

    def __init__(self, dim: int, eps: float, *, dtype: str) -> None:
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter([dim], dtype=ir_dtype(dtype))

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return rms_norm_f32(op, x, self.eps, self.weight)
