"""The Gemma-shaped decoder LM (Gemma 2 / 3 text), read op for op against HF 5.24.

What differs from :class:`mobius.lm.decoder.DecoderLM` (the KV ports, masks, attention
path and head are the same)::

    h = embed_tokens(ids) · sqrt(hidden)            (the scale rounded to the table's dtype)
    per layer:
        h = h + post_attention_layernorm(attn(input_layernorm(h)))
        h = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
    logits = softcap(norm(h) @ Wᵀ)                   (when final_logit_softcapping is set)

- every RMSNorm is Gemma's: float32 statistics, ``x̂ · (1 + w)`` in float32, cast back
  last (:class:`mobius.components.RMSNorm` with ``weight_offset=1``);
- q_norm / k_norm (Gemma 3; optional) are such norms over each head's ``head_dim``;
- attention scale ``query_pre_attn_scalar ** -0.5``, an optional score cap
  (``attn_logit_softcapping``, applied inside the attention op);
- one rope per layer type: ``rope`` on full layers, ``local_rope`` on sliding ones.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import RMSNorm, ScaledEmbedding, embed_scale, ir_dtype, logit_softcap
from mobius.lm.config import FULL, SLIDING, GemmaConfig
from mobius.lm.decoder import DecoderLM, SelfAttention, decoder_shape, gated_mlp
from mobius.lm.ports import build_graph, lm_ports
from mobius.lm.weights import decoder_plan, hf_plain
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE
from mobius.weights import WeightPlan

SANDWICH_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


def gemma_norm(dim: int, eps: float, dtype: ir.DataType, *, fused: bool = False) -> RMSNorm:
    """Gemma's RMSNorm: ``x̂ · (1 + w)`` in float32, cast back to the input dtype last
    (``fused``: onnxruntime's fused norm ops, see :class:`mobius.components.RMSNorm`)."""
    return RMSNorm(dim, eps, weight_offset=1.0, dtype=dtype, fused=fused)


class GemmaSelfAttention(SelfAttention):
    """:class:`SelfAttention` with Gemma's q/k norms, scale and optional score cap."""

    def __init__(
        self, cfg: GemmaConfig, i: int, dtype: ir.DataType, path: str, *, fused_norms=False
    ) -> None:
        super().__init__(cfg, i, dtype, path, qk_norm=False)
        if cfg.qk_norm:
            self.q_norm = gemma_norm(cfg.head_dim, cfg.rms_norm_eps, dtype, fused=fused_norms)
            self.k_norm = gemma_norm(cfg.head_dim, cfg.rms_norm_eps, dtype, fused=fused_norms)
        self.core.scale = float(cfg.query_pre_attn_scalar) ** -0.5
        self.core.softcap = float(cfg.attn_logit_softcapping or 0.0)


class GemmaDecoderLayer(nn.Module):
    """Sandwich-norm layer; children ``self_attn``, ``mlp`` and :data:`SANDWICH_NORMS`.
    ``forward`` as :class:`mobius.lm.decoder.DecoderLayer`'s (the residual stream is
    ``h + pending``; with ``fused_norms`` the normed MLP output is handed on unadded)."""

    def __init__(
        self,
        cfg: GemmaConfig,
        self_attn: SelfAttention,
        mlp: nn.Module,
        dtype: ir.DataType,
        *,
        fused_norms: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.fused_norms = fused_norms
        for name in SANDWICH_NORMS:
            norm = gemma_norm(cfg.hidden_size, cfg.rms_norm_eps, dtype, fused=fused_norms)
            setattr(self, name, norm)

    def forward(self, op, h, cos, sin, mask, past_key, past_value, pending=None):
        x, h = self.input_layernorm.residual(op, h, pending)
        a, pk, pv = self.self_attn(op, x, cos, sin, mask, past_key, past_value)
        x, h = self.pre_feedforward_layernorm.residual(op, h, self.post_attention_layernorm(op, a))
        m = self.post_feedforward_layernorm(op, self.mlp(op, x))
        if self.fused_norms:
            return h, m, pk, pv
        return op.Add(h, m), None, pk, pv


class GemmaDecoderLM(DecoderLM):
    """The ``model`` graph body of a Gemma text decoder (parameters under HF's names
    without ``model.``, as :class:`DecoderLM`'s; the Gemma layers replace its own)."""

    def __init__(
        self,
        cfg: GemmaConfig,
        dtype: ir.DataType,
        target: str = "default",
        *,
        family: str,
        logits: str = "all",
    ) -> None:
        super().__init__(cfg, dtype, target, family=family, logits=logits)
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.embed_tokens = ScaledEmbedding(cfg.vocab_size, H, embed_scale(H, dtype), dtype=dtype)
        self.layers = nn.ModuleList(
            [
                GemmaDecoderLayer(
                    cfg,
                    GemmaSelfAttention(cfg, i, dtype, self.path, fused_norms=self.fused_norms),
                    gated_mlp(cfg, i, dtype),
                    dtype,
                    fused_norms=self.fused_norms,
                )
                for i in range(cfg.num_hidden_layers)
            ]
        )
        self.norm = gemma_norm(H, eps, dtype, fused=self.fused_norms)

    def rotary(self, op, position_ids):
        cfg = self.cfg
        ropes = {FULL: (cfg.rope, "rope"), SLIDING: (cfg.local_rope, "rope_local")}
        used = sorted(set(cfg.layer_types))
        return {t: self.cos_sin(op, ropes[t][0], position_ids, ropes[t][1]) for t in used}

    def logits(self, op, h, pending=None):
        return logit_softcap(op, super().logits(op, h, pending), self.cfg.final_logit_softcapping)


def build_gemma(
    cfg: GemmaConfig,
    build_dtype: str,
    target: str = "default",
    *,
    family: str,
    logits: str = "all",
):
    """The ``model`` graph of :func:`mobius.lm.lm_contract` for ``decoder_shape(cfg)``
    (``logits`` as for :func:`mobius.lm.decoder.build_decoder`)."""
    inputs, outputs = lm_ports(decoder_shape(cfg), PORT_DTYPE_OF_BUILD_DTYPE[build_dtype], logits)
    module = GemmaDecoderLM(cfg, ir_dtype(build_dtype), target, family=family, logits=logits)
    return build_graph(cfg.model_type, inputs, outputs, module)


def gemma_plan(cfg: GemmaConfig, checkpoint, dtype: str) -> WeightPlan:
    """:func:`mobius.lm.weights.decoder_plan` plus the two feed-forward norms per layer."""
    plan = decoder_plan(cfg, checkpoint, dtype, qk_norm=cfg.qk_norm)
    for i in range(cfg.num_hidden_layers):
        for n in SANDWICH_NORMS[2:]:
            name = f"layers.{i}.{n}.weight"
            plan.add(name, hf_plain(name, dtype))
    return plan
