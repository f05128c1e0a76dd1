"""The ``audio_encoder`` graph: Gemma 4 USM-style Conformer + ``embed_audio`` (docs/gemma4.md §6.2, §9).

Inputs ``input_features [batch, time, mel]`` (model dtype) and
``input_features_mask bool [batch, time]`` (contiguous right padding); outputs
``audio_features [num_valid_frames, H]`` (valid frames of every item, batch-major,
rank 2 via ``Compress``) and the diagnostic ``audio_features_mask bool
[batch, ceil(ceil(time/2)/2)]``.

HF computes attention in blocks of ``attention_chunk_size`` with a relative
shift; here it is dense T×T with the same window (keys ``0 ≤ i − j <
context_left − 1``, plus ``0 < j − i < context_right``) and the relative term
gathered by ``GatherElements`` at index ``j − i + context_left − 1``. For every
valid query that is the same arithmetic; padded queries differ but are dropped,
and nothing flows from them to valid frames (causal conv, masked keys).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components import Linear, RMSNorm, constant, ir_dtype, keep_rows
from mobius.lm.ports import build_graph
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE, BuildOptions
from mobius_gemma4.audio.config import Gemma4AudioConfig
from mobius_gemma4.ports import audio_ports
from mobius_gemma4.vision.layers import BOOL, F32, ClippableLinear, MultimodalEmbedder

AUDIO_COMPONENT = "audio_encoder"
"""Component name of the audio graph in a package contract."""

HF_DEFAULT_EPS = 1e-6
"""HF builds the conformer's FFN and attention-block norms with ``Gemma4RMSNorm``'s default
eps, not ``rms_norm_eps`` (only the light-conv norms, the subsampling LayerNorms and the
embedder read the config); mirrored here so a config with another eps still matches."""

_FINFO_MAX = {
    "float32": 3.4028234663852886e38,
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
}


def relative_position_table(cfg: Gemma4AudioConfig) -> np.ndarray:
    """Sinusoids ``[P, hidden]`` for distances ``P−1 … 0`` (``[sin…, cos…]``), P = context//2 + 1."""
    context = (
        cfg.attention_chunk_size + cfg.attention_context_left - 1 + cfg.attention_context_right
    )
    n = cfg.hidden_size // 2
    inc = math.log(10000.0) / max(n - 1, 1)
    inv = np.exp(np.arange(n, dtype=np.float32) * np.float32(-inc)).astype(np.float32)
    pos = np.arange(context // 2, -1, -1, dtype=np.float32)[:, None]
    t = pos * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=-1).astype(np.float32)


class SubsampleLayer(nn.Module):
    """Masked input → Conv2d 3×3 stride 2 (no bias) → LayerNorm over channels (no bias) → ReLU."""

    def __init__(self, c_in: int, c_out: int, eps: float, dtype: str) -> None:
        super().__init__()
        self.eps = eps
        self.conv = _Weight([c_out, c_in, 3, 3], dtype)
        self.norm = _Weight([c_out], dtype)

    def forward(self, op, x, mask):
        x = op.Mul(x, op.CastLike(op.Unsqueeze(mask, [1, 3]), x))
        x = op.Conv(x, self.conv(op), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        x = op.Transpose(x, perm=[0, 2, 3, 1])
        x = op.LayerNormalization(x, self.norm(op), axis=-1, epsilon=self.eps)
        return op.Transpose(op.Relu(x), perm=[0, 3, 1, 2])


class _Weight(nn.Module):
    """A bare ``weight`` parameter under the module's scope (``<scope>.weight``)."""

    def __init__(self, shape: list[int], dtype: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(shape, dtype=ir_dtype(dtype))

    def forward(self, op):
        return self.weight


def _every_other(op: OpBuilder, mask: ir.Value) -> ir.Value:
    """``mask[:, ::2]`` with a bounded end (an INT64_MAX end breaks inferred shapes)."""
    end = op.Shape(mask, start=1, end=2)
    return op.Slice(
        mask,
        op.Constant(value_ints=[0]),
        end,
        op.Constant(value_ints=[1]),
        op.Constant(value_ints=[2]),
    )


class SubsampleConvProjection(nn.Module):
    def __init__(self, cfg: Gemma4AudioConfig, dtype: str) -> None:
        super().__init__()
        c0, c1 = cfg.subsampling_conv_channels
        self.layer0 = SubsampleLayer(1, c0, cfg.rms_norm_eps, dtype)
        self.layer1 = SubsampleLayer(c0, c1, cfg.rms_norm_eps, dtype)
        self.input_proj_linear = ClippableLinear(
            (c0 // 4) * c1, cfg.hidden_size, False, dtype=dtype
        )

    def forward(self, op, feats, mask):
        x = op.Unsqueeze(feats, [1])  # [B, 1, T, F]
        x = self.layer0(op, x, mask)
        mask = _every_other(op, mask)
        x = self.layer1(op, x, mask)
        mask = _every_other(op, mask)
        x = op.Transpose(x, perm=[0, 2, 3, 1])  # [B, T', F', C]: freq-major, channel-minor
        x = op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))
        return self.input_proj_linear(op, x), mask


class FeedForward(nn.Module):
    """Half-step FFN: clip → norm → Lin(h→4h) → silu → Lin(4h→h) → clip → norm → ·w + residual."""

    def __init__(self, cfg: Gemma4AudioConfig, dtype: str, clip: float) -> None:
        super().__init__()
        h, c = cfg.hidden_size, cfg.use_clipped_linears
        self.clip, self.weight_ = clip, cfg.residual_weight
        self.ffw_layer_1 = ClippableLinear(h, 4 * h, c, dtype=dtype)
        self.ffw_layer_2 = ClippableLinear(4 * h, h, c, dtype=dtype)
        self.pre_layer_norm = RMSNorm(h, HF_DEFAULT_EPS, dtype=dtype)
        self.post_layer_norm = RMSNorm(h, HF_DEFAULT_EPS, dtype=dtype)

    def forward(self, op, x, lo, hi):
        y = self.pre_layer_norm(op, op.Clip(x, lo, hi))
        y = self.ffw_layer_2(op, _silu(op, self.ffw_layer_1(op, y)))
        y = self.post_layer_norm(op, op.Clip(y, lo, hi))
        return op.Add(op.Mul(y, op.CastLike(op.Constant(value_float=self.weight_), y)), x)


def _silu(op, x):
    return op.Mul(x, op.Sigmoid(x))


class AudioAttention(nn.Module):
    """Local causal attention with relative-position term, per-dim scale and logit cap (f32)."""

    def __init__(self, cfg: Gemma4AudioConfig, dtype: str) -> None:
        super().__init__()
        self.cfg = cfg
        h, c = cfg.hidden_size, cfg.use_clipped_linears
        self.q_proj = ClippableLinear(h, h, c, dtype=dtype)
        self.k_proj = ClippableLinear(h, h, c, dtype=dtype)
        self.v_proj = ClippableLinear(h, h, c, dtype=dtype)
        self.post = ClippableLinear(h, h, c, dtype=dtype)
        self.relative_k_proj = ClippableLinear(h, h, False, dtype=dtype)
        self.per_dim_scale = nn.Parameter([cfg.head_dim], dtype=ir_dtype(dtype))

    def forward(self, op, x, table, allowed, rel_index):
        cfg = self.cfg
        nh, hd = cfg.num_attention_heads, cfg.head_dim
        shape = op.Constant(value_ints=[0, 0, nh, hd])

        def heads(v):  # [B, T, h] -> f32 [B, nh, T, hd]
            return op.Transpose(op.Reshape(op.Cast(v, to=F32), shape), perm=[0, 2, 1, 3])

        q_scale = (hd**-0.5) / math.log(2)
        k_scale = math.log(1 + math.e) / math.log(2)
        q = op.Mul(
            op.Mul(heads(self.q_proj(op, x)), op.Constant(value_float=q_scale)),
            op.Softplus(op.Cast(self.per_dim_scale, to=F32)),
        )
        k = op.Mul(heads(self.k_proj(op, x)), op.Constant(value_float=k_scale))
        v = heads(self.v_proj(op, x))
        ac = op.MatMul(q, op.Transpose(k, perm=[0, 1, 3, 2]))  # [B, nh, T, T]
        relk = op.Cast(self.relative_k_proj(op, op.CastLike(table, x)), to=F32)  # [P, h]
        relk = op.Transpose(op.Reshape(relk, op.Constant(value_ints=[-1, nh, hd])), perm=[1, 2, 0])
        bd = op.MatMul(q, relk)  # [B, nh, T, P]
        zero_col = op.Expand(
            op.Constant(value_float=0.0),
            op.Concat(op.Shape(bd, start=0, end=3), op.Constant(value_ints=[1]), axis=0),
        )
        bd = op.Concat(bd, zero_col, axis=-1)  # out-of-table distances read 0 (HF's shift padding)
        idx = op.Expand(rel_index, op.Shape(ac))
        s = op.Add(ac, op.GatherElements(bd, idx, axis=3))
        cap = op.Constant(value_float=cfg.attention_logit_cap)
        s = op.Mul(op.Tanh(op.Div(s, cap)), cap)
        s = op.Where(allowed, s, op.Constant(value_float=cfg.attention_invalid_logits_value))
        p = op.Softmax(s, axis=-1)
        out = op.Transpose(op.MatMul(p, v), perm=[0, 2, 1, 3])
        out = op.Reshape(out, op.Constant(value_ints=[0, 0, nh * hd]))
        return self.post(op, op.CastLike(out, x))


class LightConv(nn.Module):
    """norm → Lin(h→2h) → GLU → causal depthwise Conv1d → clip → norm → silu → Lin(h→h) + residual."""

    def __init__(self, cfg: Gemma4AudioConfig, dtype: str) -> None:
        super().__init__()
        h, c = cfg.hidden_size, cfg.use_clipped_linears
        self.h, self.k = h, cfg.conv_kernel_size
        self.linear_start = ClippableLinear(h, 2 * h, c, dtype=dtype)
        self.linear_end = ClippableLinear(h, h, c, dtype=dtype)
        self.depthwise_conv1d = _Weight([h, 1, cfg.conv_kernel_size], dtype)
        self.pre_layer_norm = RMSNorm(h, cfg.rms_norm_eps, dtype=dtype)
        self.conv_norm = RMSNorm(h, cfg.rms_norm_eps, dtype=dtype)

    def forward(self, op, x, lo, hi):
        y = self.linear_start(op, self.pre_layer_norm(op, x))
        a, b = op.Split(y, num_outputs=2, axis=-1, _outputs=2)
        y = op.Transpose(op.Mul(a, op.Sigmoid(b)), perm=[0, 2, 1])  # [B, h, T]
        y = op.Conv(
            y, self.depthwise_conv1d(op), kernel_shape=[self.k], pads=[self.k - 1, 0], group=self.h
        )
        y = op.Clip(op.Transpose(y, perm=[0, 2, 1]), lo, hi)
        y = self.linear_end(op, _silu(op, self.conv_norm(op, y)))
        return op.Add(y, x)


class ConformerLayer(nn.Module):
    def __init__(self, cfg: Gemma4AudioConfig, dtype: str, clip: float) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.feed_forward1 = FeedForward(cfg, dtype, clip)
        self.feed_forward2 = FeedForward(cfg, dtype, clip)
        self.self_attn = AudioAttention(cfg, dtype)
        self.lconv1d = LightConv(cfg, dtype)
        self.norm_pre_attn = RMSNorm(h, HF_DEFAULT_EPS, dtype=dtype)
        self.norm_post_attn = RMSNorm(h, HF_DEFAULT_EPS, dtype=dtype)
        self.norm_out = RMSNorm(h, HF_DEFAULT_EPS, dtype=dtype)

    def forward(self, op, x, lo, hi, table, allowed, rel_index):
        x = self.feed_forward1(op, x, lo, hi)
        a = self.self_attn(
            op, self.norm_pre_attn(op, op.Clip(x, lo, hi)), table, allowed, rel_index
        )
        x = op.Add(self.norm_post_attn(op, op.Clip(a, lo, hi)), x)
        x = self.lconv1d(op, x, lo, hi)
        x = self.feed_forward2(op, x, lo, hi)
        return self.norm_out(op, op.Clip(x, lo, hi))


class AudioTower(nn.Module):
    """``Gemma4AudioModel``: subsampling, conformer layers, ``output_proj`` (with bias)."""

    def __init__(self, cfg: Gemma4AudioConfig, dtype: str) -> None:
        super().__init__("audio_tower")
        self.cfg, self.dtype = cfg, dtype
        self.clip = min(cfg.gradient_clipping, _FINFO_MAX[dtype])
        self.subsample_conv_projection = SubsampleConvProjection(cfg, dtype)
        self.layers = nn.ModuleList(
            [ConformerLayer(cfg, dtype, self.clip) for _ in range(cfg.num_hidden_layers)]
        )
        self.output_proj = Linear(cfg.hidden_size, cfg.output_proj_dims, True, dtype=dtype)

    def _window(self, op, mask):
        """``allowed [B, 1, T, T]`` (window ∧ key valid) and relative index ``[T, T]``."""
        cfg = self.cfg
        past, future = cfg.attention_context_left - 1, cfg.attention_context_right
        n_rel = (cfg.attention_chunk_size + past + future) // 2 + 1
        t = op.Squeeze(op.Shape(mask, start=1, end=2), [0])
        ar = op.Range(op.Constant(value_int=0), t, op.Constant(value_int=1))
        dist = op.Sub(op.Unsqueeze(ar, [1]), op.Unsqueeze(ar, [0]))  # i − j
        zero = op.Constant(value_int=0)
        left = op.And(op.GreaterOrEqual(dist, zero), op.Less(dist, op.Constant(value_int=past)))
        right = op.And(op.Less(dist, zero), op.Less(op.Neg(dist), op.Constant(value_int=future)))
        allowed = op.And(op.Or(left, right), op.Unsqueeze(mask, [1, 2]))
        rel = op.Add(op.Neg(dist), op.Constant(value_int=past))  # j − i + past
        in_table = op.And(op.GreaterOrEqual(rel, zero), op.Less(rel, op.Constant(value_int=n_rel)))
        rel_index = op.Where(in_table, rel, op.Constant(value_int=n_rel))
        return allowed, rel_index

    def forward(self, op, feats, mask):
        x, mask = self.subsample_conv_projection(op, feats, mask)
        table = constant(op, relative_position_table(self.cfg), "rel_pos_table")
        allowed, rel_index = self._window(op, mask)
        lo = op.CastLike(op.Constant(value_float=-self.clip), x)
        hi = op.CastLike(op.Constant(value_float=self.clip), x)
        for layer in self.layers:
            x = layer(op, x, lo, hi, table, allowed, rel_index)
        return self.output_proj(op, x), mask


def build_audio_encoder(
    cfg: Gemma4AudioConfig, text_hidden_size: int, options: BuildOptions
) -> ir.Model:
    """Build the ``audio_encoder`` graph (initializers without data; bind with the weight
    plan); ports :func:`mobius_gemma4.ports.audio_ports`."""
    dtype = PORT_DTYPE_OF_BUILD_DTYPE[options.dtype]
    tower = AudioTower(cfg, dtype)
    embedder = MultimodalEmbedder(
        cfg.output_proj_dims, text_hidden_size, cfg.rms_norm_eps, dtype, "embed_audio"
    )

    def forward(op, ins):
        hidden, out_mask = tower(op, ins["input_features"], ins["input_features_mask"])
        emb = embedder(op, hidden)
        return {
            "audio_features": op.CastLike(keep_rows(op, emb, out_mask, text_hidden_size), emb),
            "audio_features_mask": op.Cast(out_mask, to=BOOL),
        }

    inputs, outputs = audio_ports(cfg, text_hidden_size, dtype)
    return build_graph(AUDIO_COMPONENT, inputs, outputs, forward)
