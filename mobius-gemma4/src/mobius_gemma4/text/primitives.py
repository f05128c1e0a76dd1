"""Gemma-specific graph pieces on top of :mod:`mobius.components`.

Linear, RMSNorm, GatedMLP, Embedding and the activations are the shared mobius-core
components; only Gemma's scaled token embedding lives here.
"""

from __future__ import annotations

import onnx_ir as ir

from mobius.components import Embedding


class ScaledEmbedding(Embedding):
    """Token lookup times a constant scale in the weight dtype (HF ``Gemma4TextScaledWordEmbedding``).

    The scale (``sqrt(hidden)``, rounded to the weight dtype as HF's buffer is — see
    :func:`mobius_gemma4.config.embed_scale`) is a graph constant, not a parameter.
    """

    def __init__(self, num: int, dim: int, scale: float, dtype: ir.DataType) -> None:
        super().__init__(num, dim, dtype=dtype)
        self.scale = scale

    def forward(self, op, ids):
        return op.Mul(super().forward(op, ids), self.scale)
