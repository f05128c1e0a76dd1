"""``Linear``: a plain MatMul against a weight stored ``[in, out]``.

Checkpoints store ``[out, in]``; the weight plan transposes once at save time
so the graph needs no Transpose node and every EP sees a plain MatMul.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype


class Linear(nn.Module):
    """``y = x @ weight (+ bias)``.

    Constructor: ``Linear(in_features, out_features, bias=False, *, dtype="float32", name=None)``.
    Parameters: ``weight`` ``[in_features, out_features]``, ``bias`` ``[out_features]`` when
    ``bias`` is true (initializer names ``<scope>.weight`` / ``<scope>.bias``).
    ``forward(op, x) -> y``: ``x`` ``[..., in_features]`` → ``y`` ``[..., out_features]``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        *,
        dtype: str | ir.DataType = "float32",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.in_features = in_features
        self.out_features = out_features
        dt = ir_dtype(dtype)
        self.weight = nn.Parameter([in_features, out_features], dtype=dt)
        self.bias = nn.Parameter([out_features], dtype=dt) if bias else None

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        y = op.MatMul(x, self.weight)
        if self.bias is not None:
            y = op.Add(y, self.bias)
        return y


def linear_transposed(op: OpBuilder, x: ir.Value, weight: ir.Value, out_features: int) -> ir.Value:
    """``x @ weightᵀ`` for a weight kept in the checkpoint's ``[out, in]`` layout.

    ``x`` ``[B, S, in]`` → ``[B, S, out_features]`` as one ``Gemm(transB=1)`` on the
    flattened ``[B·S, in]``. Used for output heads: a tied head reuses the ``[V, H]``
    token-embedding table itself (one initializer), and an untied ``lm_head.weight``
    stays as stored, so the package writer streams it instead of materializing a
    transposed copy of a vocabulary-sized matrix.
    """
    hidden = op.Shape(x, start=2, end=3)
    flat = op.Reshape(x, op.Concat(op.Constant(value_ints=[-1]), hidden, axis=0))
    y = op.Gemm(flat, weight, transB=1)
    shape = op.Concat(op.Shape(x, start=0, end=2), op.Constant(value_ints=[out_features]), axis=0)
    return op.Reshape(y, shape)
