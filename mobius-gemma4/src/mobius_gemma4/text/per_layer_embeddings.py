"""Per-Layer Embeddings (PLE; E2B, E4B), docs/gemma4.md §3.6.

``combine`` makes the packed ``[B, S, L·D_ple]`` per-layer input from token ids and the
(merged) input embeddings: ``(RMSNorm_Dple(proj(emb) · H^-0.5) + E_ple[ids] · sqrt(D_ple))
· 2^-0.5``. ``Gemma4PerLayerBlock`` is the residual block each decoder layer runs after its
FFN: ``h + norm(proj(gelu_tanh(gate(h)) · ple_i))``. PLE is token-dependent, so it runs at
every step, prefill and decode.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import Linear, RMSNorm, activation
from mobius_gemma4.config import Gemma4TextConfig, embed_scale
from mobius_gemma4.text.primitives import ScaledEmbedding


class Gemma4PerLayerEmbedder(nn.Module):
    """Owns ``embed_tokens_per_layer``, ``per_layer_model_projection`` and its norm.

    Constructed by the top-level graph so the initializers keep their HF names.
    """

    def __init__(self, cfg: Gemma4TextConfig, dtype: ir.DataType, build_dtype: str) -> None:
        super().__init__()
        self.L, self.D = cfg.num_hidden_layers, cfg.hidden_size_per_layer_input
        self.H = cfg.hidden_size
        self.embed_tokens_per_layer = ScaledEmbedding(
            cfg.vocab_size_per_layer_input, self.L * self.D, embed_scale(self.D, build_dtype), dtype
        )
        self.per_layer_model_projection = Linear(self.H, self.L * self.D, dtype=dtype)
        self.per_layer_projection_norm = RMSNorm(self.D, cfg.rms_norm_eps, dtype=dtype)

    def forward(self, op, ids, inputs_embeds):
        shape4 = op.Constant(value_ints=[0, 0, self.L, self.D])
        tok = op.Reshape(self.embed_tokens_per_layer(op, ids), shape4)
        ctx = op.Mul(self.per_layer_model_projection(op, inputs_embeds), self.H**-0.5)
        ctx = self.per_layer_projection_norm(op, op.Reshape(ctx, shape4))
        ple = op.Mul(op.Add(ctx, tok), 2.0**-0.5)
        return op.Reshape(ple, op.Constant(value_ints=[0, 0, self.L * self.D]))


class Gemma4PerLayerBlock:
    """Builds the PLE residual block's modules on a decoder layer (keeps HF names)."""

    @staticmethod
    def attach(layer: nn.Module, cfg: Gemma4TextConfig, dtype: ir.DataType) -> None:
        H, D = cfg.hidden_size, cfg.hidden_size_per_layer_input
        layer.per_layer_input_gate = Linear(H, D, dtype=dtype)
        layer.per_layer_projection = Linear(D, H, dtype=dtype)
        layer.post_per_layer_input_norm = RMSNorm(H, cfg.rms_norm_eps, dtype=dtype)

    @staticmethod
    def apply(op, layer: nn.Module, h, ple_flat, i: int, width: int):
        ple_i = op.Slice(ple_flat, [i * width], [(i + 1) * width], [-1])
        g = op.Mul(activation(op, layer.per_layer_input_gate(op, h), "gelu_tanh"), ple_i)
        return op.Add(h, layer.post_per_layer_input_norm(op, layer.per_layer_projection(op, g)))
