"""The MoE block of Gemma 4 (26B-A4B), run beside the dense MLP (docs/gemma4.md §3.5).

Router (HF ``Gemma4TextRouter``, op for op): weightless RMSNorm of the residual stream,
× ``scale`` × ``H^-0.5``, projection to E logits, softmax in float32, top-k, renormalise
(core :func:`mobius.components.route`), × ``per_expert_scale[idx]``. Experts: core
:class:`mobius.components.RoutedExperts` with GELU-tanh gating — ``gate_up_proj
[E, 2I, H]`` (gate rows first) and ``down_proj [E, H, I]`` are stored transposed by the
weight plan (``[E, H, 2I]``, ``[E, I, H]``). Only the experts the step's tokens picked are
gathered and multiplied, so a decode step reads ``top_k`` experts' weights, not all
``num_experts`` (see the README's MoE section and benchmarks/moe.py).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import Linear, RMSNorm, RoutedExperts, route
from mobius_gemma4.config import Gemma4TextConfig

FLOAT = ir.DataType.FLOAT


class Gemma4Router(nn.Module):
    def __init__(self, cfg: Gemma4TextConfig, dtype: ir.DataType) -> None:
        super().__init__()
        H, E = cfg.hidden_size, cfg.num_experts
        self.eps, self.dtype, self.k, self.hidden = cfg.rms_norm_eps, dtype, cfg.top_k_experts, H
        self.norm = RMSNorm(H, self.eps, with_weight=False, dtype=dtype)
        self.proj = Linear(H, E, dtype=dtype)
        self.scale = nn.Parameter([H], dtype=dtype)
        self.per_expert_scale = nn.Parameter([E], dtype=dtype)

    def forward(self, op, r):
        """``r`` ``[T, H]`` → ``(weights [T, k] float32, indices [T, k] int64)``."""
        n = self.norm(op, r)
        n = op.Mul(op.Mul(n, self.scale), self.hidden**-0.5)
        w, idx = route(op, self.proj(op, n), self.k, softmax_first=True, normalize=True)
        pes = op.Gather(self.per_expert_scale, idx, axis=0)
        return op.Mul(w, pes if self.dtype == FLOAT else op.Cast(pes, to=FLOAT)), idx


def gemma4_experts(cfg: Gemma4TextConfig, dtype: ir.DataType) -> RoutedExperts:
    """Gemma 4's experts: the core routed block with GELU-tanh (``hidden_activation``) gating."""
    return RoutedExperts(
        cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, "gelu_tanh", dtype=dtype
    )
