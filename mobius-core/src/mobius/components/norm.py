"""``RMSNorm`` accumulated in float32, and ``LayerNorm`` (``nn.LayerNorm``) in float32.

Gemma's hidden states reach magnitudes where ``x²`` overflows float16 (±65504),
so the statistics are always computed in float32 and the result is cast back to
the input dtype at the end. The weight is applied as stored (``x̂ · w``), or as
``x̂ · (1 + w)`` with ``weight_offset=1.0`` for checkpoints that store ``w - 1`` (Gemma 2/3
style). ``weight_after_cast`` multiplies the weight after the cast back to the input
dtype, as HF's Llama / Qwen RMSNorms do (``weight * x.to(input_dtype)``); the default
multiplies in float32 (Gemma 4). For float32 graphs the two are identical.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype

_F32 = ir.DataType.FLOAT


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x², -1) + eps) · weight``, computed in float32, returned in x's dtype.

    Constructor: ``RMSNorm(dim, eps=1e-6, with_weight=True, *, weight_offset=0.0,
    weight_after_cast=False, dtype="float32", name=None)``.
    Parameter: ``weight`` ``[dim]`` (only when ``with_weight``; the weightless variant has
    no parameter at all), applied as ``weight_offset + weight``.
    ``forward(op, x) -> y`` normalizes over the last axis.
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        with_weight: bool = True,
        *,
        weight_offset: float = 0.0,
        weight_after_cast: bool = False,
        dtype: str | ir.DataType = "float32",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.dim = dim
        self.eps = float(eps)
        self.weight = nn.Parameter([dim], dtype=ir_dtype(dtype)) if with_weight else None
        self.weight_offset = float(weight_offset)
        self.weight_after_cast = bool(weight_after_cast)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        # 1/sqrt (what torch computes for ``pow(v, -0.5)`` and ``rsqrt``), not Pow(-0.5):
        # the two differ in the last bits, which showed at the 1e-5 logit level in Gemma 4.
        is_f32 = x.dtype == _F32  # known float32 input: no Cast/CastLike round trip
        x32 = x if is_f32 else op.Cast(x, to=_F32)
        mean_sq = op.ReduceMean(op.Mul(x32, x32), [-1], keepdims=1)
        inv_rms = op.Reciprocal(op.Sqrt(op.Add(mean_sq, self.eps)))
        y = op.Mul(x32, inv_rms)
        if self.weight is None:
            return y if is_f32 else op.CastLike(y, x)
        w = self.weight
        if self.weight_after_cast and not is_f32:
            w = w if self.weight_offset == 0 else op.Add(w, op.CastLike(self.weight_offset, w))
            return op.Mul(op.CastLike(y, x), op.CastLike(w, x))
        w32 = w if w.dtype == _F32 else op.Cast(w, to=_F32)
        if self.weight_offset != 0:
            w32 = op.Add(w32, self.weight_offset)
        y = op.Mul(y, w32)
        return y if is_f32 else op.CastLike(y, x)


class LayerNorm(nn.Module):
    """``nn.LayerNorm`` over the last axis: ``(x − mean) / sqrt(var + eps) · weight + bias``.

    Constructor: ``LayerNorm(dim, eps=1e-5, *, dtype="float32", name=None)``.
    Parameters: ``weight`` and ``bias`` ``[dim]``.
    ``forward(op, x) -> y``: statistics and result in float32 (one
    ``LayerNormalization``); ``y`` is float32 whatever ``x``'s dtype, so a caller casts
    back exactly where HF's tensor is in the model dtype.
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-5,
        *,
        dtype: str | ir.DataType = "float32",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.weight = nn.Parameter([dim], dtype=ir_dtype(dtype))
        self.bias = nn.Parameter([dim], dtype=ir_dtype(dtype))
        self.dim, self.eps = dim, float(eps)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        def f32(v):
            return v if v.dtype == _F32 else op.Cast(v, to=_F32)

        return op.LayerNormalization(
            f32(x), f32(self.weight), f32(self.bias), axis=-1, epsilon=self.eps
        )
