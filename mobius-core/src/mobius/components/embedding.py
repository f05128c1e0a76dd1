"""``Embedding``: a Gather from a ``[vocab, dim]`` table."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype


class Embedding(nn.Module):
    """Token lookup ``weight[ids]``.

    Constructor: ``Embedding(vocab_size, dim, *, dtype="float32", name=None)``.
    Parameter: ``weight`` ``[vocab_size, dim]``.
    ``forward(op, ids) -> x``: int64 ``ids`` of any shape → ``[*ids.shape, dim]``.
    Gemma's ``sqrt(hidden)`` scaling: :class:`ScaledEmbedding`.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        *,
        dtype: str | ir.DataType = "float32",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.vocab_size = vocab_size
        self.dim = dim
        self.weight = nn.Parameter([vocab_size, dim], dtype=ir_dtype(dtype))

    def forward(self, op: OpBuilder, ids: ir.Value) -> ir.Value:
        return op.Gather(self.weight, ids, axis=0)


def embed_scale(dim: int, dtype: str | ir.DataType = "float32") -> float:
    """``sqrt(dim)`` rounded to ``dtype`` (from float32), as HF's Gemma embeddings cast their
    scale buffer to the weight dtype (``sqrt(3072)`` = 55.4256 becomes 55.5 in bfloat16)."""
    import math

    import numpy as np

    from mobius.components.dtypes import numpy_dtype

    return float(np.float32(math.sqrt(dim)).astype(numpy_dtype(dtype)))


class ScaledEmbedding(Embedding):
    """Token lookup times a constant (Gemma's ``weight[ids] · sqrt(dim)``, HF
    ``Gemma3TextScaledWordEmbedding``).

    Constructor: ``ScaledEmbedding(vocab_size, dim, scale, *, dtype="float32", name=None)``;
    ``scale`` is a graph constant multiplied in the table's dtype (see :func:`embed_scale`).
    Parameter and ``forward(op, ids)`` as :class:`Embedding`.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        scale: float,
        *,
        dtype: str | ir.DataType = "float32",
        name: str | None = None,
    ) -> None:
        super().__init__(vocab_size, dim, dtype=dtype, name=name)
        self.scale = float(scale)

    def forward(self, op: OpBuilder, ids: ir.Value) -> ir.Value:
        return op.Mul(super().forward(op, ids), self.scale)
