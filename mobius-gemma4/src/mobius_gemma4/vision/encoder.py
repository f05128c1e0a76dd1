"""The ``vision_encoder`` graph: Gemma 4 vision tower + ``embed_vision`` (docs/gemma4.md §5.2, §9).

Inputs ``pixel_values [batch, num_patches, 3·p²]`` (model dtype) and
``pixel_position_ids int64 [batch, num_patches, 2]`` ((−1, −1) marks padding);
output ``image_features [num_image_tokens, H]``: the valid pooled bins of every
image, in HF's flattened (batch-major) order, projected to the text width.

Pooling works on the fixed ``num_patches / k²`` bins of each image plus a valid
mask, then one ``Compress`` drops the empty bins, so several images of different
sizes in one batch need no per-image control flow. Compress runs on float32
(onnxruntime has no bf16 Compress; the pooled values are float32 anyway).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components import Attention, RMSNorm, ir_dtype, keep_rows
from mobius.lm.ports import build_graph
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE, BuildOptions
from mobius_gemma4.ports import vision_ports
from mobius_gemma4.vision.config import Gemma4VisionConfig
from mobius_gemma4.vision.layers import (
    ACTIVATIONS,
    BOOL,
    F32,
    ClippableLinear,
    MultimodalEmbedder,
)

VISION_COMPONENT = "vision_encoder"
"""Component name of the vision graph in a package contract."""


class PatchEmbedder(nn.Module):
    """``input_proj(2·(pv − 0.5)) + T[0][x] + T[1][y]``, position term zeroed at padding."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: str) -> None:
        super().__init__()
        self.input_proj = ClippableLinear(cfg.patch_dim, cfg.hidden_size, False, dtype=dtype)
        self.position_embedding_table = nn.Parameter(
            [2, cfg.position_embedding_size, cfg.hidden_size], dtype=ir_dtype(dtype)
        )

    def forward(self, op, pv, px, py, pad):
        two = op.CastLike(op.Constant(value_float=2.0), pv)
        half = op.CastLike(op.Constant(value_float=0.5), pv)
        h = self.input_proj(op, op.Mul(two, op.Sub(pv, half)))
        table_x = op.Gather(self.position_embedding_table, op.Constant(value_int=0), axis=0)
        table_y = op.Gather(self.position_embedding_table, op.Constant(value_int=1), axis=0)
        zero = op.Constant(value_int=0)
        pos = op.Add(
            op.Gather(table_x, op.Max(px, zero), axis=0),
            op.Gather(table_y, op.Max(py, zero), axis=0),
        )
        pos = op.Where(op.Unsqueeze(pad, [-1]), op.CastLike(op.Constant(value_float=0.0), pos), pos)
        return op.Add(h, pos)


def _rope_2d(op: OpBuilder, x: ir.Value, cos_sin: tuple[ir.Value, ...]) -> ir.Value:
    """Axial RoPE on ``x [B, N, heads, hd]``: first half rotates with x, second with y.

    Each half is split-half ``rotate_half`` over quarter-sized pairs (HF
    ``apply_multidimensional_rope`` with ``[fx, fx, fy, fy]`` cos/sin).
    """
    cx, sx, cy, sy = cos_sin
    ax, bx, ay, by = op.Split(x, num_outputs=4, axis=-1, _outputs=4)
    return op.Concat(
        op.Sub(op.Mul(ax, cx), op.Mul(bx, sx)),
        op.Add(op.Mul(bx, cx), op.Mul(ax, sx)),
        op.Sub(op.Mul(ay, cy), op.Mul(by, sy)),
        op.Add(op.Mul(by, cy), op.Mul(ay, sy)),
        axis=-1,
    )


class VisionAttention(nn.Module):
    """Bidirectional attention with q/k norms, weightless v-norm, 2-D RoPE, scale 1.0, on
    the core :class:`mobius.components.Attention` op (grouped KV heads, float32 softmax as
    HF's eager attention computes it; padding keys masked out)."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: str) -> None:
        super().__init__()
        self.cfg = cfg
        h, hd = cfg.hidden_size, cfg.head_dim
        nh, kvh, clip = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.use_clipped_linears
        self.q_proj = ClippableLinear(h, nh * hd, clip, dtype=dtype)
        self.k_proj = ClippableLinear(h, kvh * hd, clip, dtype=dtype)
        self.v_proj = ClippableLinear(h, kvh * hd, clip, dtype=dtype)
        self.o_proj = ClippableLinear(nh * hd, h, clip, dtype=dtype)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=dtype)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=dtype)
        self.v_norm = RMSNorm(hd, cfg.rms_norm_eps, with_weight=False, dtype=dtype)
        self.core = Attention(nh, kvh, hd, scale=1.0, softmax_float32=True)

    def _heads(self, op, x, n, norm, cos_sin=None):
        """``[B, N, n·hd]`` → per-head norm (and 2-D RoPE) → ``[B, N, n·hd]``."""
        x = norm(op, op.Reshape(x, op.Constant(value_ints=[0, 0, n, self.cfg.head_dim])))
        if cos_sin is not None:
            x = _rope_2d(op, x, cos_sin)
        return op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))

    def forward(self, op, x, cos_sin, keep):
        cfg = self.cfg
        nh, kvh = cfg.num_attention_heads, cfg.num_key_value_heads
        q = self._heads(op, self.q_proj(op, x), nh, self.q_norm, cos_sin)
        k = self._heads(op, self.k_proj(op, x), kvh, self.k_norm, cos_sin)
        v = self._heads(op, self.v_proj(op, x), kvh, self.v_norm)
        out, _, _ = self.core(op, q, k, v, keep)
        return self.o_proj(op, out)


class VisionMLP(nn.Module):
    """GeGLU: ``down(act(gate(x)) · up(x))`` with clippable linears."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: str) -> None:
        super().__init__()
        h, i, clip = cfg.hidden_size, cfg.intermediate_size, cfg.use_clipped_linears
        self.act = ACTIVATIONS[cfg.hidden_activation]
        self.gate_proj = ClippableLinear(h, i, clip, dtype=dtype)
        self.up_proj = ClippableLinear(h, i, clip, dtype=dtype)
        self.down_proj = ClippableLinear(i, h, clip, dtype=dtype)

    def forward(self, op, x):
        return self.down_proj(op, op.Mul(self.act(op, self.gate_proj(op, x)), self.up_proj(op, x)))


class VisionLayer(nn.Module):
    """Sandwich-normed attention and MLP blocks with residuals."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: str) -> None:
        super().__init__()
        eps, h = cfg.rms_norm_eps, cfg.hidden_size
        self.self_attn = VisionAttention(cfg, dtype)
        self.mlp = VisionMLP(cfg, dtype)
        self.input_layernorm = RMSNorm(h, eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(h, eps, dtype=dtype)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, dtype=dtype)
        self.post_feedforward_layernorm = RMSNorm(h, eps, dtype=dtype)

    def forward(self, op, x, cos_sin, keep):
        a = self.self_attn(op, self.input_layernorm(op, x), cos_sin, keep)
        x = op.Add(x, self.post_attention_layernorm(op, a))
        m = self.mlp(op, self.pre_feedforward_layernorm(op, x))
        return op.Add(x, self.post_feedforward_layernorm(op, m))


class VisionEncoder(nn.Module):
    """``encoder.layers.*`` of the tower."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList([VisionLayer(cfg, dtype) for _ in range(cfg.num_hidden_layers)])

    def forward(self, op, x, cos_sin, keep):
        for layer in self.layers:
            x = layer(op, x, cos_sin, keep)
        return x


class VisionTower(nn.Module):
    """``Gemma4VisionModel``: patch embedder, encoder, pooler, optional standardize."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: str) -> None:
        super().__init__("vision_tower")
        self.cfg = cfg
        self.patch_embedder = PatchEmbedder(cfg, dtype)
        self.encoder = VisionEncoder(cfg, dtype)
        if cfg.standardize:
            self.std_bias = nn.Parameter([cfg.hidden_size], dtype=ir_dtype(dtype))
            self.std_scale = nn.Parameter([cfg.hidden_size], dtype=ir_dtype(dtype))

    def _rope_tables(self, op, px, py, dtype_like):
        """cos/sin ``[B, N, 1, hd/4]`` for x and y, computed in f32 like HF, cast to model dtype."""
        hd = self.cfg.head_dim
        spatial = hd // 2
        inv = [1.0 / (self.cfg.rope_theta ** (j / spatial)) for j in range(0, spatial, 2)]
        inv_freq = op.Constant(value_floats=inv)
        out = []
        for p in (px, py):
            f = op.Mul(op.Unsqueeze(op.Cast(p, to=F32), [-1, -2]), inv_freq)
            out += [op.CastLike(op.Cos(f), dtype_like), op.CastLike(op.Sin(f), dtype_like)]
        return tuple(out)

    def forward(self, op, pv, pos):
        cfg = self.cfg
        px = op.Squeeze(op.Slice(pos, [0], [1], [2]), [2])
        py = op.Squeeze(op.Slice(pos, [1], [2], [2]), [2])
        minus_one = op.Constant(value_int=-1)
        pad = op.And(op.Equal(px, minus_one), op.Equal(py, minus_one))  # [B, N]
        h = self.patch_embedder(op, pv, px, py, pad)
        cos_sin = self._rope_tables(op, px, py, h)
        # [B, 1, N, N]: every query sees the real patches (onnxruntime's Attention wants
        # the mask's query axis spelled out, no broadcast there)
        n = op.Shape(pad, start=1, end=2)
        mask_shape = op.Concat(op.Shape(pad, start=0, end=1), [1], n, n, axis=0)
        keep = op.Expand(op.Unsqueeze(op.Not(pad), [1, 2]), mask_shape)
        h = self.encoder(op, h, cos_sin, keep)
        pooled, valid = self._pool(op, h, px, py, pad)
        feats = keep_rows(op, pooled, valid, cfg.hidden_size)  # f32 [rows, D]
        if cfg.standardize:
            feats = op.Mul(
                op.Sub(feats, op.Cast(self.std_bias, to=F32)), op.Cast(self.std_scale, to=F32)
            )
        return op.CastLike(feats, h)

    def _pool(self, op, h, px, py, pad):
        """k×k average by patch position into ``N / k²`` bins; returns f32 ``[B, L, D]`` and ``[B, L]`` mask."""
        k = self.cfg.pooling_kernel_size
        zero_h = op.CastLike(op.Constant(value_float=0.0), h)
        h = op.Where(op.Unsqueeze(pad, [-1]), zero_h, h)
        root = op.Constant(value_float=float(self.cfg.hidden_size**0.5))
        if k == 1:
            return op.Mul(op.Cast(h, to=F32), root), op.Not(pad)
        kk = op.Constant(value_int=k)
        zero = op.Constant(value_int=0)
        cx, cy = op.Max(px, zero), op.Max(py, zero)
        max_x = op.Add(op.ReduceMax(cx, [1], keepdims=1), op.Constant(value_int=1))  # [B, 1]
        bins = op.Add(op.Div(cx, kk), op.Mul(op.Div(max_x, kk), op.Div(cy, kk)))  # [B, N]
        n = op.Shape(h, start=1, end=2)
        length = op.Squeeze(op.Div(n, op.Constant(value_ints=[k * k])), [0])
        ids = op.Range(zero, length, op.Constant(value_int=1))  # [L]
        one_hot = op.Cast(op.Equal(op.Unsqueeze(bins, [-1]), ids), to=F32)  # [B, N, L]
        weights = op.Div(one_hot, op.Constant(value_float=float(k * k)))
        pooled = op.MatMul(op.Transpose(weights, perm=[0, 2, 1]), op.Cast(h, to=F32))  # [B, L, D]
        valid = op.Cast(op.ReduceMax(one_hot, [1], keepdims=0), to=BOOL)  # [B, L]
        # HF casts the pooled average back to the working dtype before the f32 scaling.
        pooled = op.Cast(op.CastLike(pooled, h), to=F32)
        return op.Mul(pooled, root), valid


def build_vision_encoder(
    cfg: Gemma4VisionConfig, text_hidden_size: int, options: BuildOptions
) -> ir.Model:
    """Build the ``vision_encoder`` graph (initializers without data; bind with the weight plan).

    Ports (:func:`mobius_gemma4.ports.vision_ports`): ``pixel_values [batch, num_patches,
    3·p²]`` and ``pixel_position_ids int64 [batch, num_patches, 2]`` in; ``image_features
    [num_image_tokens, H]`` out, float ports at the build dtype. ``num_patches`` must be a
    multiple of ``pooling_kernel_size²`` (the processor pads to ``max_soft_tokens · k²``).
    """
    dtype = PORT_DTYPE_OF_BUILD_DTYPE[options.dtype]
    tower = VisionTower(cfg, dtype)
    embedder = MultimodalEmbedder(
        cfg.hidden_size, text_hidden_size, cfg.rms_norm_eps, dtype, "embed_vision"
    )

    def forward(op, ins):
        feats = tower(op, ins["pixel_values"], ins["pixel_position_ids"])
        return {"image_features": embedder(op, feats)}

    inputs, outputs = vision_ports(cfg, text_hidden_size, dtype)
    return build_graph(VISION_COMPONENT, inputs, outputs, forward)
