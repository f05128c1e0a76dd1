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
    Any scaling (Gemma's ``sqrt(hidden)``) is the caller's business.
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
