"""Dense GeGLU MLP of Gemma 4: ``down(gelu_tanh(gate(x)) · up(x))``, no bias (reference §3.5).

The width is ``intermediate_size``, doubled on KV-consumer layers of double-wide models
(``Gemma4TextConfig.mlp_width``).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_gemma4.text.primitives import Linear, gelu_tanh


class Gemma4MLP(nn.Module):
    def __init__(self, hidden: int, width: int, dtype: ir.DataType) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, width, dtype)
        self.up_proj = Linear(hidden, width, dtype)
        self.down_proj = Linear(width, hidden, dtype)

    def forward(self, op, x):
        return self.down_proj(op, op.Mul(gelu_tanh(op, self.gate_proj(op, x)), self.up_proj(op, x)))
