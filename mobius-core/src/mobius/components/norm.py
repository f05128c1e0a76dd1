"""``RMSNorm`` accumulated in float32, and ``LayerNorm`` (``nn.LayerNorm``) in float32.

Gemma's hidden states reach magnitudes where ``x²`` overflows float16 (±65504),
so the statistics are always computed in float32 and the result is cast back to
the input dtype at the end. The weight is applied as stored (``x̂ · w``), or as
``x̂ · (1 + w)`` with ``weight_offset=1.0`` for checkpoints that store ``w - 1`` (Gemma 2/3
style). ``weight_after_cast`` multiplies the weight after the cast back to the input
dtype, as HF's Llama / Qwen RMSNorms do (``weight * x.to(input_dtype)``); the default
multiplies in float32 (Gemma 4). For float32 graphs the two are identical.

``fused=True`` (see :func:`fused_rmsnorm_available`: ``--target cpu`` float32 builds)
writes each norm as one ONNX ``RMSNormalization`` node (opset 23; onnxruntime's CPU kernel
is its ``SimplifiedLayerNormalization``'s, which onnx.checker does not know) instead of the
seven-node Mul/ReduceMean/Add/Sqrt/Reciprocal/Mul/Mul chain, and :meth:`RMSNorm.residual` writes a
residual add followed by the norm as one ``com.microsoft.SkipSimplifiedLayerNormalization``
(output 0 the normed sum, output 3 the sum).
onnxruntime's kernels sum ``x²`` in their own order and divide by ``sqrt(mean + eps)``
where the chain multiplies by its reciprocal: the results differ from the chain's in the
last bit of some values (measured on the real SmolLM2 / Gemma 3 files with float
activations: logits within 5e-5). Other targets keep the chain, which matches torch
bit for bit.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype
from mobius.components.graph import ms_opset

_F32 = ir.DataType.FLOAT

FUSED_NORM_TARGETS: tuple[str, ...] = ("cpu",)
"""Build targets whose graphs write RMSNorms as onnxruntime's fused norm ops (float32)."""


def fused_rmsnorm_available(target: str, dtype: str | ir.DataType) -> bool:
    """True when a ``--target`` build in ``dtype`` writes :class:`RMSNorm` fused
    (``RMSNorm(..., fused=True)``): ``cpu`` float32 builds. ``default`` never does (it
    is the portable graph); other dtypes keep the chain, whose float16/bfloat16 casts
    and weight order the fused kernels do not reproduce."""
    return target in FUSED_NORM_TARGETS and ir_dtype(dtype) == _F32


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x², -1) + eps) · weight``, computed in float32, returned in x's dtype.

    Constructor: ``RMSNorm(dim, eps=1e-6, with_weight=True, *, weight_offset=0.0,
    weight_after_cast=False, dtype="float32", fused=False, name=None)``.
    Parameter: ``weight`` ``[dim]`` (only when ``with_weight``; the weightless variant has
    no parameter at all), applied as ``weight_offset + weight``.
    ``forward(op, x) -> y`` normalizes over the last axis.
    ``residual(op, h, delta) -> (y, s)``: ``s = h + delta`` and ``y`` its norm
    (``delta=None``: ``s = h``), one node when ``fused``.
    ``fused`` (float32 inputs only; others keep the chain): onnxruntime's fused norm ops,
    see the module docstring.
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
        fused: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.dim = dim
        self.eps = float(eps)
        self.weight = nn.Parameter([dim], dtype=ir_dtype(dtype)) if with_weight else None
        self.weight_offset = float(weight_offset)
        self.weight_after_cast = bool(weight_after_cast)
        self.fused = bool(fused)

    def _gamma(self, op: OpBuilder) -> ir.Value:
        """The float32 ``[dim]`` scale of the fused ops: ``weight_offset + weight`` (an op on
        an initializer, which onnxruntime folds at load), or ones without a weight."""
        if self.weight is None:
            return op.Constant(value=ir.tensor([1.0] * self.dim, dtype=_F32))
        w = self.weight if self.weight.dtype == _F32 else op.Cast(self.weight, to=_F32)
        return w if self.weight_offset == 0 else op.Add(w, self.weight_offset)

    def residual(
        self, op: OpBuilder, h: ir.Value, delta: ir.Value | None
    ) -> tuple[ir.Value, ir.Value]:
        """``(norm(h + delta), h + delta)``; with ``delta=None``, ``(norm(h), h)``. Unfused,
        exactly ``Add(h, delta)`` then the norm; fused (float32), one
        ``com.microsoft.SkipSimplifiedLayerNormalization``."""
        if delta is None:
            return self(op, h), h
        if not (self.fused and h.dtype == _F32 and delta.dtype == _F32):
            s = op.Add(h, delta)
            return self(op, s), s
        return self(op, delta, residual=h)

    def _skip_norm(self, op: OpBuilder, delta: ir.Value, h: ir.Value):
        y, _, _, s = ms_opset(op).SkipSimplifiedLayerNormalization(
            delta, h, self._gamma(op), epsilon=self.eps, _outputs=4
        )
        for v in (y, s):
            v.type, v.shape = h.type, h.shape
        return y, s

    def forward(
        self, op: OpBuilder, x: ir.Value, residual: ir.Value | None = None
    ) -> ir.Value | tuple[ir.Value, ir.Value]:
        # ``residual`` is :meth:`residual`'s (it goes through ``__call__``, which names the
        # weight in this module's scope): returns ``(norm(residual + x), residual + x)``.
        if residual is not None:
            return self._skip_norm(op, x, residual)
        return self._norm(op, x)

    def _norm(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        if self.fused and x.dtype == _F32:
            y = op.RMSNormalization(x, self._gamma(op), axis=-1, epsilon=self.eps, stash_type=1)
            y.type, y.shape = x.type, x.shape
            return y
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
