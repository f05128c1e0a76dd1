"""The ``vision_encoder`` and ``audio_encoder`` graphs of a ``gemma4_unified`` package (docs/gemma4.md §7).

Gemma 4 12B has no vision or audio tower: HF's ``Gemma4UnifiedVisionEmbedder`` and the audio
``Gemma4UnifiedMultimodalEmbedder`` map raw inputs straight into the text width.

vision (``pixel_values [batch, num_patches, 6912]`` = raw 48×48×3 merged patches in [0, 1],
HWC; ``pixel_position_ids int64 [batch, num_patches, 2]`` = (x, y), (−1, −1) for padding)::

    h = LN₂(LN₁(pv) @ W_dense + b)                      patch_ln1 / patch_dense / patch_ln2
    h = LN_pos(h + P[x, 0]·[x ≠ −1] + P[y, 1]·[y ≠ −1])  pos_embedding [mm_posemb_size, 2, D]
    f = rms_noscale(h) @ W_proj                          multimodal_embedder (D → H)
    image_features = f[all(pos ≠ −1)]                    [num_image_tokens, H], batch-major

No pixel rescaling (HF feeds the processor's [0, 1] values to ``patch_ln1`` as they are)
and no pooling: one soft token per merged patch. The LayerNorms are ``nn.LayerNorm``
(weight and bias, eps 1e-5) computed in float32 (:class:`mobius.components.LayerNorm`). In f16 builds ``patch_dense`` and
``patch_ln2`` run in float32: the Dense output reaches ≈ 77 000 on real images, beyond
f16's 65 504; ``patch_ln2`` brings it back into range.

audio (``input_features [batch, time, 640]`` raw 16 kHz samples, ``input_features_mask
bool [batch, time]``)::

    audio_features = (rms_noscale(x) @ W_proj)[mask]     [num_audio_tokens, H]

Padding rows are dropped with ``Compress`` on float32 (onnxruntime has no bf16 Compress).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components import LayerNorm, Linear, ir_dtype, keep_rows
from mobius.lm.ports import build_graph
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE, BuildOptions
from mobius_gemma4.ports import audio_ports, vision_ports
from mobius_gemma4.unified.config import UnifiedAudioConfig, UnifiedVisionConfig
from mobius_gemma4.vision.layers import F32, MultimodalEmbedder

VISION_COMPONENT, AUDIO_COMPONENT = "vision_encoder", "audio_encoder"


def _f32(op: OpBuilder, x: ir.Value, dtype: str) -> ir.Value:
    """``x`` as float32 (no node when the build is already float32)."""
    return x if dtype == "float32" else op.Cast(x, to=F32)


def _back(op: OpBuilder, x: ir.Value, like: ir.Value, dtype: str) -> ir.Value:
    """A float32 ``x`` back in the build dtype (no node when the build is float32)."""
    return x if dtype == "float32" else op.CastLike(x, like)


class Dense(Linear):
    """``nn.Linear`` with bias (:class:`mobius.components.Linear`), optionally run in float32."""

    def __init__(self, in_features: int, out_features: int, dtype: str) -> None:
        super().__init__(in_features, out_features, True, dtype=dtype)
        self.dtype = dtype

    def forward(self, op: OpBuilder, x: ir.Value, *, f32: bool = False) -> ir.Value:
        """``x @ W + b``; ``f32`` computes in float32 whatever the build dtype."""
        if f32:
            w, b = _f32(op, self.weight, self.dtype), _f32(op, self.bias, self.dtype)
            return op.Add(op.MatMul(_f32(op, x, self.dtype), w), b)
        return super().forward(op, x)


class VisionEmbedder(nn.Module):
    """HF ``Gemma4UnifiedVisionEmbedder`` (initializers ``embed_vision.*``)."""

    def __init__(self, cfg: UnifiedVisionConfig, text_hidden: int, dtype: str) -> None:
        super().__init__("embed_vision")
        d, eps = cfg.mm_embed_dim, cfg.layer_norm_eps
        self.dtype = dtype
        self.patch_ln1 = LayerNorm(cfg.patch_dim, eps, dtype=dtype)
        self.patch_dense = Dense(cfg.patch_dim, d, dtype)
        self.patch_ln2 = LayerNorm(d, eps, dtype=dtype)
        self.pos_embedding = nn.Parameter([cfg.mm_posemb_size, 2, d], dtype=ir_dtype(dtype))
        self.pos_norm = LayerNorm(d, eps, dtype=dtype)
        self.multimodal_embedder = MultimodalEmbedder(d, text_hidden, cfg.rms_norm_eps, dtype)

    def _position(self, op: OpBuilder, coord: ir.Value, axis: int, like: ir.Value) -> ir.Value:
        """``P[clamp(c, 0), axis]``, zeroed where ``c == −1``."""
        table = op.Gather(self.pos_embedding, op.Constant(value_int=axis), axis=1)  # [P, D]
        rows = op.Gather(table, op.Max(coord, op.Constant(value_int=0)), axis=0)  # [B, N, D]
        pad = op.Unsqueeze(op.Equal(coord, op.Constant(value_int=-1)), [-1])
        return op.Where(pad, op.CastLike(op.Constant(value_float=0.0), like), rows)

    def forward(self, op: OpBuilder, pv: ir.Value, px: ir.Value, py: ir.Value) -> ir.Value:
        dt = self.dtype
        h = _back(op, self.patch_ln1(op, pv), pv, dt)
        # f16: the Dense output overflows f16 (docs/gemma4.md §7), so Dense + patch_ln2 stay in float32.
        h = self.patch_dense(op, h, f32=dt == "float16")
        h = _back(op, self.patch_ln2(op, h), pv, dt)
        pos = op.Add(self._position(op, px, 0, h), self._position(op, py, 1, h))
        h = _back(op, self.pos_norm(op, op.Add(h, pos)), pv, dt)
        return self.multimodal_embedder(op, h)


def build_unified_vision_encoder(
    cfg: UnifiedVisionConfig, text_hidden: int, options: BuildOptions
) -> ir.Model:
    """The ``vision_encoder`` graph (initializers without data; bind with the weight plan);
    ports :func:`mobius_gemma4.ports.vision_ports`."""
    dtype = PORT_DTYPE_OF_BUILD_DTYPE[options.dtype]
    embedder = VisionEmbedder(cfg, text_hidden, dtype)

    def forward(op, ins):
        pos = ins["pixel_position_ids"]
        px = op.Squeeze(op.Slice(pos, [0], [1], [2]), [2])
        py = op.Squeeze(op.Slice(pos, [1], [2], [2]), [2])
        minus_one = op.Constant(value_int=-1)
        keep = op.And(op.Not(op.Equal(px, minus_one)), op.Not(op.Equal(py, minus_one)))
        feats = embedder(op, ins["pixel_values"], px, py)
        return {"image_features": _back(op, keep_rows(op, feats, keep, text_hidden), feats, dtype)}

    inputs, outputs = vision_ports(cfg, text_hidden, dtype)
    return build_graph(VISION_COMPONENT, inputs, outputs, forward)


def build_unified_audio_encoder(
    cfg: UnifiedAudioConfig, text_hidden: int, options: BuildOptions
) -> ir.Model:
    """The ``audio_encoder`` graph (initializers without data; bind with the weight plan);
    ports :func:`mobius_gemma4.ports.audio_ports`."""
    dtype = PORT_DTYPE_OF_BUILD_DTYPE[options.dtype]
    embedder = MultimodalEmbedder(
        cfg.audio_embed_dim, text_hidden, cfg.rms_norm_eps, dtype, "embed_audio"
    )

    def forward(op, ins):
        feats = embedder(op, ins["input_features"])
        kept = keep_rows(op, feats, ins["input_features_mask"], text_hidden)
        return {"audio_features": _back(op, kept, feats, dtype)}

    inputs, outputs = audio_ports(cfg, text_hidden, dtype)
    return build_graph(AUDIO_COMPONENT, inputs, outputs, forward)
