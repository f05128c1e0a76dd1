"""``logit_softcap``: Gemma's ``cap · tanh(x / cap)`` on logits."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder


def logit_softcap(op: OpBuilder, x: ir.Value, cap: float | None) -> ir.Value:
    """``cap · tanh(x / cap)`` in ``x``'s dtype, op for op as HF (divide, tanh, multiply);
    ``x`` unchanged when ``cap`` is None. (Attention-score caps are an attribute of
    :class:`mobius.components.Attention` instead.)"""
    if cap is None:
        return x
    return op.Mul(op.Tanh(op.Div(x, float(cap))), float(cap))
