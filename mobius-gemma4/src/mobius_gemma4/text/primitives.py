"""Small graph building blocks of the text decoder: Linear, RMSNorm, Embedding, GELU-tanh.

They follow the mobius.components conventions (Linear weights stored ``[in, out]`` so the
graph is a plain MatMul; RMSNorm accumulates in float32 and casts back, with or without a
weight) and reproduce HF's ``Gemma4RMSNorm`` op for op: ``x · (mean(x²) + eps)^-0.5 · w``
in float32, ``w`` used as-is.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

FLOAT = ir.DataType.FLOAT


class Linear(nn.Module):
    """Bias-free linear layer; ``weight`` is ``[in, out]`` (the plan transposes HF's ``[out, in]``)."""

    def __init__(self, in_features: int, out_features: int, dtype: ir.DataType) -> None:
        super().__init__()
        self.weight = nn.Parameter([in_features, out_features], dtype=dtype)

    def forward(self, op, x):
        return op.MatMul(x, self.weight)


def rms_norm_f32(op, x, eps: float, weight=None, dtype: ir.DataType = FLOAT):
    """RMSNorm over the last axis, accumulated in float32, result cast back to ``dtype``."""
    xf = x if dtype == FLOAT else op.Cast(x, to=FLOAT)
    ms = op.ReduceMean(op.Mul(xf, xf), [-1], keepdims=1)
    y = op.Mul(xf, op.Reciprocal(op.Sqrt(op.Add(ms, eps))))  # torch pow(x, -0.5) is 1/sqrt
    if weight is not None:
        y = op.Mul(y, weight if dtype == FLOAT else op.Cast(weight, to=FLOAT))
    return y if dtype == FLOAT else op.Cast(y, to=dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learned weight (``with_weight``) or without (v_norm, router norm)."""

    def __init__(self, dim: int, eps: float, dtype: ir.DataType, with_weight: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.dtype = dtype
        self.weight = nn.Parameter([dim], dtype=dtype) if with_weight else None

    def forward(self, op, x):
        return rms_norm_f32(op, x, self.eps, self.weight, self.dtype)


class ScaledEmbedding(nn.Module):
    """Token lookup times a constant scale in the weight dtype (HF ``Gemma4TextScaledWordEmbedding``)."""

    def __init__(self, num: int, dim: int, scale: float, dtype: ir.DataType) -> None:
        super().__init__()
        self.weight = nn.Parameter([num, dim], dtype=dtype)
        self.scale = scale

    def forward(self, op, ids):
        return op.Mul(op.Gather(self.weight, ids, axis=0), self.scale)


def gelu_tanh(op, x):
    """``gelu_pytorch_tanh``: ONNX Gelu with approximate="tanh"."""
    return op.Gelu(x, approximate="tanh")
