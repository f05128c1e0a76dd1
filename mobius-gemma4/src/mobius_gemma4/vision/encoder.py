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

from mobius.components import RMSNorm
from mobius.components.dtypes import ir_dtype
from mobius.components.graph import add_input, add_output, finish_model, new_graph
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE, BuildOptions
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
    """Bidirectional attention with q/k norms, weightless v-norm, 2-D RoPE, scale 1.0."""

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

    def _heads(self, op, x, n):
        return op.Reshape(x, op.Constant(value_ints=[0, 0, n, self.cfg.head_dim]))

    def _repeat_kv(self, op, x):
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        if rep == 1:
            return x
        kvh, hd = self.cfg.num_key_value_heads, self.cfg.head_dim
        x = op.Unsqueeze(x, [2])  # [B, kvh, 1, N, hd]
        shape = op.Shape(x)
        target = op.Concat(
            op.Slice(shape, [0], [2]),
            op.Constant(value_ints=[rep]),
            op.Slice(shape, [3], [5]),
            axis=0,
        )
        x = op.Expand(x, target)
        return op.Reshape(x, op.Constant(value_ints=[0, kvh * rep, -1, hd]))

    def forward(self, op, x, cos_sin, key_bias):
        cfg = self.cfg
        q = self.q_norm(op, self._heads(op, self.q_proj(op, x), cfg.num_attention_heads))
        k = self.k_norm(op, self._heads(op, self.k_proj(op, x), cfg.num_key_value_heads))
        v = self.v_norm(op, self._heads(op, self.v_proj(op, x), cfg.num_key_value_heads))
        q = op.Transpose(_rope_2d(op, q, cos_sin), perm=[0, 2, 1, 3])
        k = self._repeat_kv(op, op.Transpose(_rope_2d(op, k, cos_sin), perm=[0, 2, 1, 3]))
        v = self._repeat_kv(op, op.Transpose(v, perm=[0, 2, 1, 3]))
        scores = op.Add(op.MatMul(q, op.Transpose(k, perm=[0, 1, 3, 2])), op.CastLike(key_bias, q))
        probs = op.CastLike(op.Softmax(op.Cast(scores, to=F32), axis=-1), q)
        out = op.Transpose(op.MatMul(probs, v), perm=[0, 2, 1, 3])
        out = op.Reshape(
            out, op.Constant(value_ints=[0, 0, cfg.num_attention_heads * cfg.head_dim])
        )
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

    def forward(self, op, x, cos_sin, key_bias):
        a = self.self_attn(op, self.input_layernorm(op, x), cos_sin, key_bias)
        x = op.Add(x, self.post_attention_layernorm(op, a))
        m = self.mlp(op, self.pre_feedforward_layernorm(op, x))
        return op.Add(x, self.post_feedforward_layernorm(op, m))


class VisionEncoder(nn.Module):
    """``encoder.layers.*`` of the tower."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList([VisionLayer(cfg, dtype) for _ in range(cfg.num_hidden_layers)])

    def forward(self, op, x, cos_sin, key_bias):
        for layer in self.layers:
            x = layer(op, x, cos_sin, key_bias)
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
        # Key-padding bias [B, 1, 1, N]: 0 for real patches, f32 lowest for padding (HF eager).
        lowest = op.Constant(value_float=(-3.4028234663852886e38))
        key_bias = op.Where(op.Unsqueeze(pad, [1, 2]), lowest, op.Constant(value_float=0.0))
        h = self.encoder(op, h, cos_sin, key_bias)
        pooled, valid = self._pool(op, h, px, py, pad)
        d = cfg.hidden_size
        rows = op.Reshape(pooled, op.Constant(value_ints=[-1, d]))  # f32 [B·L, D]
        keep = op.Reshape(valid, op.Constant(value_ints=[-1]))
        feats = op.Compress(rows, keep, axis=0)
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

    Ports: ``pixel_values [batch, num_patches, 3·p²]`` and ``pixel_position_ids``
    ``int64 [batch, num_patches, 2]`` in; ``image_features [num_image_tokens, H]`` out,
    all float ports at the build dtype. ``num_patches`` must be a multiple of
    ``pooling_kernel_size²`` (the processor pads to ``max_soft_tokens · k²``).
    """
    dtype = PORT_DTYPE_OF_BUILD_DTYPE[options.dtype]
    graph, _builder, op = new_graph(VISION_COMPONENT)
    pv = add_input(op, "pixel_values", dtype, ("batch", "num_patches", cfg.patch_dim))
    pos = add_input(op, "pixel_position_ids", "int64", ("batch", "num_patches", 2))
    tower = VisionTower(cfg, dtype)
    embedder = MultimodalEmbedder(
        cfg.hidden_size, text_hidden_size, cfg.rms_norm_eps, dtype, "embed_vision"
    )
    feats = embedder(op, tower(op, pv, pos))
    add_output(
        op, feats, "image_features", dtype=dtype, shape=("num_image_tokens", text_hidden_size)
    )
    return finish_model(graph)
