"""One Gemma 4 text decoder layer (docs/gemma4.md §3.7), HF ``Gemma4TextDecoderLayer`` op for op::

    h = h + post_attention_layernorm(attn(input_layernorm(h)))
    r = h; f = mlp(pre_feedforward_layernorm(h))
    [MoE: f = post_feedforward_layernorm_1(f) + post_feedforward_layernorm_2(experts(...))]
    h = r + post_feedforward_layernorm(f)
    [PLE: h = h + post_per_layer_input_norm(per_layer_projection(gelu(gate(h)) · ple_i))]
    h = h · layer_scalar

Attention: q = RoPE(q_norm(q_proj(x))); cache owners add k = RoPE(k_norm(k_proj(x))) and
v = v_norm(v_proj(x)) — or, on full layers of k_eq_v models, v = v_norm(raw k projection)
(taken before k_norm and RoPE). Scale 1.0 (the q/k norms replace 1/sqrt(hd)). q/k/v are
3-D ``[B, S, heads·hd]``, rotated by ONNX ``RotaryEmbedding`` with each layer type's own
(default or proportional) cos/sin, then one core attention op per layer
(:class:`mobius.components.Attention` or :class:`mobius.components.GroupQueryAttention`,
chosen per layer by :func:`mobius_gemma4.text.model.attention_paths`; the softmax runs in
float32 for half-precision builds). A KV consumer (docs/gemma4.md §3.4) attends exactly the
producer's post-update cache and writes none: on the Attention path that cache is its K/V
(no past), on the GroupQueryAttention path it is the past, with empty ``[B, 0, kvh·hd]``
K/V; the op's own present is discarded.

MoE (26B-A4B, docs/gemma4.md §3.5), run beside the dense MLP: router (HF
``Gemma4TextRouter``) = weightless RMSNorm of the residual stream × ``scale`` × ``H^-0.5``,
projection to E logits, softmax in float32, top-k, renormalise (core
:func:`mobius.components.route`), × ``per_expert_scale[idx]``; experts are core
:class:`mobius.components.RoutedExperts` with GELU-tanh gating (only the experts the step's
tokens picked are gathered, see the README's MoE section).

Per-Layer Embeddings (PLE; E2B, E4B, docs/gemma4.md §3.6): :class:`PerLayerEmbedder` makes
the packed ``[B, S, L·D_ple]`` input ``(RMSNorm_Dple(proj(emb) · H^-0.5) + E_ple[ids] ·
sqrt(D_ple)) · 2^-0.5``; every layer adds its slice after the FFN (above). PLE is
token-dependent, so it runs at every step, prefill and decode.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import (
    Attention,
    GatedMLP,
    GroupQueryAttention,
    Linear,
    RMSNorm,
    RoutedExperts,
    ScaledEmbedding,
    activation,
    apply_rotary,
    embed_scale,
    route,
)
from mobius.lm.decoder import GQA
from mobius_gemma4.config import FULL, Gemma4TextConfig

FLOAT = ir.DataType.FLOAT


class Gemma4Attention(nn.Module):
    """``forward(op, x, cos, sin, mask, past_key, past_value) -> (out, key, value)``.

    ``mask`` is the layer type's bool mask ``[B, 1, S, T]`` on the ``Attention`` path and
    the ``(seqlens_k, total_sequence_length)`` pair of :func:`mobius.components.gqa_lengths`
    on the GroupQueryAttention path. ``past_*`` is the layer's own past, or for a KV
    consumer the producer's present, which it returns as its key/value.
    """

    def __init__(self, cfg: Gemma4TextConfig, i: int, dtype: ir.DataType, path: str) -> None:
        super().__init__()
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        self.hd, self.kvh, self.nh = cfg.head_dims[i], cfg.kv_heads[i], nh
        eps = cfg.rms_norm_eps
        self.consumer = cfg.is_kv_consumer(i)
        self.k_eq_v = cfg.uses_k_eq_v(i)
        self.path = path
        self.q_proj = Linear(H, nh * self.hd, dtype=dtype)
        self.q_norm = RMSNorm(self.hd, eps, dtype=dtype)
        if not self.consumer:
            self.k_proj = Linear(H, self.kvh * self.hd, dtype=dtype)
            if not self.k_eq_v:
                self.v_proj = Linear(H, self.kvh * self.hd, dtype=dtype)
            self.k_norm = RMSNorm(self.hd, eps, dtype=dtype)
            self.v_norm = RMSNorm(self.hd, eps, with_weight=False, dtype=dtype)
        self.o_proj = Linear(nh * self.hd, H, dtype=dtype)
        if path == GQA:
            window = cfg.sliding_window if cfg.layer_types[i] != FULL else -1
            self.core = GroupQueryAttention(
                nh, self.kvh, self.hd, scale=1.0, local_window_size=window
            )
        else:
            self.core = Attention(nh, self.kvh, self.hd, scale=1.0, softmax_float32=dtype != FLOAT)

    def _normed(self, op, x, norm, heads: int):
        """Per-head RMSNorm of ``[B, S, heads·hd]``."""
        split = op.Reshape(x, op.Constant(value_ints=[0, 0, heads, self.hd]))
        return op.Reshape(norm(op, split), op.Constant(value_ints=[0, 0, -1]))

    def forward(self, op, x, cos, sin, mask, past_key, past_value):
        q = self._normed(op, self.q_proj(op, x), self.q_norm, self.nh)
        q = apply_rotary(op, q, cos, sin, num_heads=self.nh)
        past = (past_key, past_value)
        if self.consumer and self.path == GQA:
            k = v = op.Slice(q, [0, 0], [0, self.kvh * self.hd], [1, 2])  # [B, 0, kvh·hd]
        elif self.consumer:  # onnxruntime's Attention takes no empty K/V: the cache as K/V
            k, v = (op.Reshape(op.Transpose(t, perm=[0, 2, 1, 3]), [0, 0, -1]) for t in past)
            past = (None, None)
        else:
            k_raw = self.k_proj(op, x)
            v = self._normed(
                op, k_raw if self.k_eq_v else self.v_proj(op, x), self.v_norm, self.kvh
            )
            k = self._normed(op, k_raw, self.k_norm, self.kvh)
            k = apply_rotary(op, k, cos, sin, num_heads=self.kvh)
        if self.path == GQA:
            y, key, value = self.core(op, q, k, v, *past, *mask)
        else:
            y, key, value = self.core(op, q, k, v, mask, *past)
        if self.consumer:
            key, value = past_key, past_value
        return self.o_proj(op, y), key, value


class Gemma4Router(nn.Module):
    """``forward(op, r [T, H]) -> (weights [T, k] float32, indices [T, k] int64)``."""

    def __init__(self, cfg: Gemma4TextConfig, dtype: ir.DataType) -> None:
        super().__init__()
        H, E = cfg.hidden_size, cfg.num_experts
        self.dtype, self.k, self.hidden = dtype, cfg.top_k_experts, H
        self.norm = RMSNorm(H, cfg.rms_norm_eps, with_weight=False, dtype=dtype)
        self.proj = Linear(H, E, dtype=dtype)
        self.scale = nn.Parameter([H], dtype=dtype)
        self.per_expert_scale = nn.Parameter([E], dtype=dtype)

    def forward(self, op, r):
        n = op.Mul(op.Mul(self.norm(op, r), self.scale), self.hidden**-0.5)
        w, idx = route(op, self.proj(op, n), self.k, softmax_first=True, normalize=True)
        pes = op.Gather(self.per_expert_scale, idx, axis=0)
        return op.Mul(w, pes if self.dtype == FLOAT else op.Cast(pes, to=FLOAT)), idx


class PerLayerEmbedder(nn.Module):
    """``embed_tokens_per_layer``, ``per_layer_model_projection`` and its norm under HF's
    names (the owning graph names it ``""``); ``forward(op, ids, inputs_embeds)`` → the
    packed ``[B, S, L·D_ple]`` per-layer input."""

    def __init__(self, cfg: Gemma4TextConfig, dtype: ir.DataType) -> None:
        super().__init__("")
        self.L, self.D, self.H = (
            cfg.num_hidden_layers,
            cfg.hidden_size_per_layer_input,
            cfg.hidden_size,
        )
        self.embed_tokens_per_layer = ScaledEmbedding(
            cfg.vocab_size_per_layer_input, self.L * self.D, embed_scale(self.D, dtype), dtype=dtype
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


class Gemma4DecoderLayer(nn.Module):
    """``forward(op, h, cos, sin, mask, past_key, past_value, ple=None) -> (h, key, value)``
    (``mask`` / ``past_*`` as :class:`Gemma4Attention`'s; ``ple`` the packed per-layer input)."""

    def __init__(self, cfg: Gemma4TextConfig, i: int, dtype: ir.DataType, path: str) -> None:
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.i, self.cfg = i, cfg
        self.self_attn = Gemma4Attention(cfg, i, dtype, path)
        # GeGLU, width doubled on KV consumers of double-wide models (docs/gemma4.md §3.5)
        self.mlp = GatedMLP(H, cfg.mlp_width(i), "gelu_tanh", dtype=dtype)
        norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"]
        norms.append("post_feedforward_layernorm")
        if cfg.enable_moe_block:
            self.router = Gemma4Router(cfg, dtype)
            self.experts = RoutedExperts(
                cfg.num_experts, H, cfg.moe_intermediate_size, "gelu_tanh", dtype=dtype
            )
            norms += [f"post_feedforward_layernorm_{n}" for n in (1, 2)]
            norms.append("pre_feedforward_layernorm_2")
        if cfg.has_ple:
            D = cfg.hidden_size_per_layer_input
            self.per_layer_input_gate = Linear(H, D, dtype=dtype)
            self.per_layer_projection = Linear(D, H, dtype=dtype)
            norms.append("post_per_layer_input_norm")
        for name in norms:
            setattr(self, name, RMSNorm(H, eps, dtype=dtype))
        self.layer_scalar = nn.Parameter([1], dtype=dtype)

    def forward(self, op, h, cos, sin, mask, past_key, past_value, ple=None):
        cfg = self.cfg
        a, key, value = self.self_attn(
            op, self.input_layernorm(op, h), cos, sin, mask, past_key, past_value
        )
        h = op.Add(h, self.post_attention_layernorm(op, a))
        r = h
        f = self.mlp(op, self.pre_feedforward_layernorm(op, h))
        if cfg.enable_moe_block:
            f1 = self.post_feedforward_layernorm_1(op, f)
            flat = op.Reshape(r, op.Constant(value_ints=[-1, cfg.hidden_size]))
            weights, indices = self.router(op, flat)
            moe = self.experts(op, self.pre_feedforward_layernorm_2(op, flat), weights, indices)
            moe = self.post_feedforward_layernorm_2(op, op.Reshape(moe, op.Shape(r)))
            f = op.Add(f1, moe)
        h = op.Add(r, self.post_feedforward_layernorm(op, f))
        if cfg.has_ple:
            D = cfg.hidden_size_per_layer_input
            ple_i = op.Slice(ple, [self.i * D], [(self.i + 1) * D], [-1])
            g = op.Mul(activation(op, self.per_layer_input_gate(op, h), "gelu_tanh"), ple_i)
            h = op.Add(h, self.post_per_layer_input_norm(op, self.per_layer_projection(op, g)))
        return op.Mul(h, self.layer_scalar), key, value
