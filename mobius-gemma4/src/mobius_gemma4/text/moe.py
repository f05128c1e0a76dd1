"""The MoE block of Gemma 4 (26B-A4B), run beside the dense MLP (docs/gemma4.md §3.5).

Router (HF ``Gemma4TextRouter``): weightless RMSNorm of the residual stream, × ``scale`` ×
``H^-0.5``, projection to E logits, softmax in float32, top-k, renormalise, ×
``per_expert_scale[idx]``. Experts: GELU-tanh GeGLU with ``gate_up_proj [E, 2I, H]`` (gate
rows first) and ``down_proj [E, H, I]``; the plan stores them transposed (``[E, H, 2I]``,
``[E, I, H]``) so the graph is a batched MatMul.

This first version computes *every* expert for every token and weights the results with a
dense ``[T, E]`` matrix that is zero outside the top-k (exact; E× the FLOPs of a routed
kernel — fine for tiny models and correctness, slow for 26B; see README).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import Linear, RMSNorm, activation
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
        """``r`` ``[T, H]`` → dense routing weights ``[T, E]`` (float32; zero outside top-k)."""
        n = self.norm(op, r)
        n = op.Mul(op.Mul(n, self.scale), self.hidden**-0.5)
        logits = self.proj(op, n)
        probs = op.Softmax(logits if self.dtype == FLOAT else op.Cast(logits, to=FLOAT), axis=-1)
        w, idx = op.TopK(probs, op.Constant(value_ints=[self.k]), axis=-1, _outputs=2)
        w = op.Div(w, op.ReduceSum(w, [-1], keepdims=1))
        pes = op.Gather(self.per_expert_scale, idx, axis=0)
        w = op.Mul(w, pes if self.dtype == FLOAT else op.Cast(pes, to=FLOAT))
        return op.ScatterElements(op.Mul(probs, 0.0), idx, w, axis=1)


class Gemma4Experts(nn.Module):
    def __init__(self, cfg: Gemma4TextConfig, dtype: ir.DataType) -> None:
        super().__init__()
        E, H, inter = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.inter, self.dtype = inter, dtype
        self.gate_up_proj = nn.Parameter([E, H, 2 * inter], dtype=dtype)
        self.down_proj = nn.Parameter([E, inter, H], dtype=dtype)

    def forward(self, op, x, weights):
        """``x`` ``[T, H]``, ``weights`` ``[T, E]`` float32 → ``[T, H]``."""
        gu = op.MatMul(op.Unsqueeze(x, [0]), self.gate_up_proj)  # [E, T, 2I]
        gate, up = op.Split(
            gu, op.Constant(value_ints=[self.inter, self.inter]), axis=-1, _outputs=2
        )
        y = op.MatMul(op.Mul(activation(op, gate, "gelu_tanh"), up), self.down_proj)  # [E, T, H]
        w = op.Unsqueeze(op.Transpose(weights, perm=[1, 0]), [2])  # [E, T, 1]
        if self.dtype == FLOAT:
            return op.ReduceSum(op.Mul(y, w), [0], keepdims=0)
        # HF: (expert output in M) × float32 weight, accumulated into an M buffer
        return op.ReduceSum(
            op.Cast(op.Mul(op.Cast(y, to=FLOAT), w), to=self.dtype), [0], keepdims=0
        )
