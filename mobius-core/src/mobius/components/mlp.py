"""``GatedMLP``: ``down(act(gate(x)) · up(x))``, the feed-forward of Gemma, Llama & co."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.linear import Linear

ACTIVATIONS = ("gelu_tanh", "gelu", "silu")


def activation(op: OpBuilder, x: ir.Value, name: str) -> ir.Value:
    """Apply activation ``name``: ``gelu_tanh`` (HF ``gelu_pytorch_tanh``), ``gelu``, ``silu``."""
    if name == "gelu_tanh":
        return op.Gelu(x, approximate="tanh")
    if name == "gelu":
        return op.Gelu(x)
    if name == "silu":
        return op.Mul(x, op.Sigmoid(x))
    raise ValueError(f"unknown activation {name!r}; expected one of {ACTIVATIONS}")


class GatedMLP(nn.Module):
    """Gated feed-forward block.

    Constructor: ``GatedMLP(hidden_size, intermediate_size, activation="gelu_tanh", *,
    bias=False, dtype="float32", name=None)``; ``activation`` is ``"gelu_tanh"``,
    ``"gelu"`` or ``"silu"``. Children ``gate_proj``, ``up_proj`` (hidden→intermediate) and
    ``down_proj`` (intermediate→hidden) are :class:`Linear`, so initializers are named
    ``<scope>.gate_proj.weight`` etc. (stored ``[in, out]``).
    ``forward(op, x) -> y``: ``[..., hidden]`` → ``[..., hidden]``.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        activation: str = "gelu_tanh",
        *,
        bias: bool = False,
        dtype: str | ir.DataType = "float32",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {ACTIVATIONS}")
        self.activation = activation
        self.gate_proj = Linear(hidden_size, intermediate_size, bias, dtype=dtype)
        self.up_proj = Linear(hidden_size, intermediate_size, bias, dtype=dtype)
        self.down_proj = Linear(intermediate_size, hidden_size, bias, dtype=dtype)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        gate = activation(op, self.gate_proj(op, x), self.activation)
        return self.down_proj(op, op.Mul(gate, self.up_proj(op, x)))
