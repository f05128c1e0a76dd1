"""One Gemma 4 decoder layer (docs/gemma4.md §3.7), HF ``Gemma4TextDecoderLayer`` op for op::

h = h + post_attention_layernorm(attn(input_layernorm(h)))
r = h; f = mlp(pre_feedforward_layernorm(h))
[MoE: f = post_feedforward_layernorm_1(f) + post_feedforward_layernorm_2(experts(...))]
h = r + post_feedforward_layernorm(f)
[PLE: h = h + post_per_layer_input_norm(per_layer_projection(gelu(gate(h)) · ple_i))]
h = h · layer_scalar
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import GatedMLP, RMSNorm
from mobius_gemma4.config import Gemma4TextConfig
from mobius_gemma4.text.attention import ATTENTION, Gemma4Attention
from mobius_gemma4.text.moe import Gemma4Router, gemma4_experts
from mobius_gemma4.text.per_layer_embeddings import Gemma4PerLayerBlock


class Gemma4DecoderLayer(nn.Module):
    def __init__(
        self, cfg: Gemma4TextConfig, i: int, dtype: ir.DataType, path: str = ATTENTION
    ) -> None:
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.i, self.cfg = i, cfg
        self.self_attn = Gemma4Attention(cfg, i, dtype, path)
        # GeGLU, width doubled on KV consumers of double-wide models (docs/gemma4.md §3.5)
        self.mlp = GatedMLP(H, cfg.mlp_width(i), "gelu_tanh", dtype=dtype)
        self.input_layernorm = RMSNorm(H, eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(H, eps, dtype=dtype)
        self.pre_feedforward_layernorm = RMSNorm(H, eps, dtype=dtype)
        self.post_feedforward_layernorm = RMSNorm(H, eps, dtype=dtype)
        self.layer_scalar = nn.Parameter([1], dtype=dtype)
        if cfg.enable_moe_block:
            self.router = Gemma4Router(cfg, dtype)
            self.experts = gemma4_experts(cfg, dtype)
            self.post_feedforward_layernorm_1 = RMSNorm(H, eps, dtype=dtype)
            self.post_feedforward_layernorm_2 = RMSNorm(H, eps, dtype=dtype)
            self.pre_feedforward_layernorm_2 = RMSNorm(H, eps, dtype=dtype)
        if cfg.has_ple:
            Gemma4PerLayerBlock.attach(self, cfg, dtype)

    def forward(self, op, h, cos, sin, mask, ple_flat=None, past=None, shared=None):
        """Returns ``(h, key, value)``; key/value are this layer's present (or the shared K/V).

        ``mask`` is what the layer's attention path takes (see :class:`Gemma4Attention`).
        """
        a, key, value = self.self_attn(
            op, self.input_layernorm(op, h), cos, sin, mask, past, shared
        )
        h = op.Add(h, self.post_attention_layernorm(op, a))
        r = h
        f = self.mlp(op, self.pre_feedforward_layernorm(op, h))
        if self.cfg.enable_moe_block:
            f1 = self.post_feedforward_layernorm_1(op, f)
            flat = op.Reshape(r, op.Constant(value_ints=[-1, self.cfg.hidden_size]))
            weights, indices = self.router(op, flat)
            moe = self.experts(op, self.pre_feedforward_layernorm_2(op, flat), weights, indices)
            moe = self.post_feedforward_layernorm_2(op, op.Reshape(moe, op.Shape(r)))
            f = op.Add(f1, moe)
        h = op.Add(r, self.post_feedforward_layernorm(op, f))
        if self.cfg.has_ple:
            D = self.cfg.hidden_size_per_layer_input
            h = Gemma4PerLayerBlock.apply(op, self, h, ple_flat, self.i, D)
        return op.Mul(h, self.layer_scalar), key, value
