"""Small graph pieces the Gemma 4 vision and audio towers (and the unified embedders) share.

``ClippableLinear`` mirrors HF ``Gemma4ClippableLinear``: when a tower is
configured with ``use_clipped_linears`` the checkpoint carries four scalar
bounds per linear (``input_min/max``, ``output_min/max``) that clamp the input
and the output. They are graph initializers here (shape ``[]``), bound from the
checkpoint like any weight, so one graph serves every checkpoint of a size.

``MultimodalEmbedder`` is HF ``Gemma4MultimodalEmbedder`` (``embed_vision``,
``embed_audio`` and the unified model's projections). Norms are
:class:`mobius.components.RMSNorm` (float32 statistics, as HF's ``Gemma4RMSNorm``).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components import Linear, RMSNorm
from mobius.components.dtypes import ir_dtype

F32 = ir.DataType.FLOAT
BOOL = ir.DataType.BOOL
INT64 = ir.DataType.INT64


class ClippableLinear(Linear):
    """``clip(clip(x, in_min, in_max) @ W, out_min, out_max)``; plain ``x @ W`` when not clipped.

    Parameters: ``weight`` ``[in, out]`` (:class:`mobius.components.Linear`) and, when
    ``clipped``, the scalar bounds ``input_min``, ``input_max``, ``output_min``,
    ``output_max`` (shape ``[]``).
    """

    def __init__(self, in_features: int, out_features: int, clipped: bool, *, dtype: str) -> None:
        super().__init__(in_features, out_features, dtype=dtype)
        dt = ir_dtype(dtype)
        self.clipped = clipped
        if clipped:
            self.input_min = nn.Parameter([], dtype=dt)
            self.input_max = nn.Parameter([], dtype=dt)
            self.output_min = nn.Parameter([], dtype=dt)
            self.output_max = nn.Parameter([], dtype=dt)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        if self.clipped:
            x = op.Clip(x, self.input_min, self.input_max)
        y = super().forward(op, x)
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


class MultimodalEmbedder(nn.Module):
    """HF ``Gemma4MultimodalEmbedder``: weightless RMSNorm, then ``embedding_projection``
    (no bias) to the text width. Initializer: ``<name>.embedding_projection.weight``
    ``[in, out]``; ``name`` is ``embed_vision`` / ``embed_audio`` (or, inside the unified
    vision embedder, its ``multimodal_embedder``)."""

    def __init__(
        self, in_features: int, out_features: int, eps: float, dtype: str, name: str | None = None
    ) -> None:
        super().__init__(name)
        self.embedding_pre_projection_norm = RMSNorm(
            in_features, eps, with_weight=False, dtype=dtype
        )
        self.embedding_projection = Linear(in_features, out_features, dtype=dtype)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return self.embedding_projection(op, self.embedding_pre_projection_norm(op, x))
