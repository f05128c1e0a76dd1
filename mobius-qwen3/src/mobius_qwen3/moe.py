"""The sparse MoE block of Qwen3-MoE (HF 5.24 ``Qwen3MoeSparseMoeBlock``).

Router (``Qwen3MoeTopKRouter``): ``logits = x @ gate.weightᵀ`` (``[T, E]``), softmax in
float32, top-k, renormalised when ``norm_topk_prob`` — :func:`mobius.components.route`
with ``softmax_first=True, normalize=norm_topk_prob``. Experts (``Qwen3MoeExperts``):
SiLU-gated, ``gate_up_proj [E, 2I, H]`` (gate rows first) and ``down_proj [E, H, I]`` —
:class:`mobius.components.RoutedExperts` with ``activation="silu"``; the weight plan
stores them transposed (``[E, H, 2I]``, ``[E, I, H]``), built from the per-expert
tensors of Hub checkpoints or HF's fused tensors (:mod:`mobius_qwen3.weights`).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import Linear
from mobius_qwen3.config import Qwen3Config


class Qwen3SparseMoe(nn.Module):
    """``mlp`` of a sparse layer: children ``gate`` (router) and ``experts``."""

    def __init__(self, cfg: Qwen3Config, dtype: ir.DataType) -> None:
        from mobius.components.experts import RoutedExperts

        super().__init__()
        H, E = cfg.hidden_size, cfg.num_experts
        self.hidden, self.top_k, self.normalize = H, cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = Linear(H, E, dtype=dtype)
        self.experts = RoutedExperts(E, H, cfg.moe_intermediate_size, "silu", dtype=dtype)

    def forward(self, op, h):
        from mobius.components.experts import route

        flat = op.Reshape(h, op.Constant(value_ints=[-1, self.hidden]))  # [T, H]
        weights, indices = route(
            op, self.gate(op, flat), self.top_k, softmax_first=True, normalize=self.normalize
        )
        return op.Reshape(self.experts(op, flat, weights, indices), op.Shape(h))
