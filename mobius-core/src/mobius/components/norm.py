"""``RMSNorm`` accumulated in float32.

Gemma's hidden states reach magnitudes where ``x²`` overflows float16 (±65504),
so the statistics are always computed in float32 and the result is cast back to
the input dtype at the end. The weight is applied as stored (``x̂ · w``); a
family whose checkpoint stores ``w - 1`` must add the 1 in its weight plan.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype

_F32 = ir.DataType.FLOAT


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x², -1) + eps) · weight``, computed in float32, returned in x's dtype.

    Constructor: ``RMSNorm(dim, eps=1e-6, with_weight=True, *, dtype="float32", name=None)``.
    Parameter: ``weight`` ``[dim]`` (only when ``with_weight``; the weightless variant has
    no parameter at all). ``forward(op, x) -> y`` normalizes over the last axis.
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        with_weight: bool = True,
        *,
        dtype: str | ir.DataType = "float32",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.dim = dim
        self.eps = float(eps)
        self.weight = nn.Parameter([dim], dtype=ir_dtype(dtype)) if with_weight else None

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        # 1/sqrt (what torch computes for ``pow(v, -0.5)`` and ``rsqrt``), not Pow(-0.5):
        # the two differ in the last bits, which showed at the 1e-5 logit level in Gemma 4.
        is_f32 = x.dtype == _F32  # known float32 input: no Cast/CastLike round trip
        x32 = x if is_f32 else op.Cast(x, to=_F32)
        mean_sq = op.ReduceMean(op.Mul(x32, x32), [-1], keepdims=1)
        inv_rms = op.Reciprocal(op.Sqrt(op.Add(mean_sq, self.eps)))
        y = op.Mul(x32, inv_rms)
        if self.weight is not None:
            w = self.weight
            y = op.Mul(y, w if w.dtype == _F32 else op.Cast(w, to=_F32))
        return y if is_f32 else op.CastLike(y, x)
