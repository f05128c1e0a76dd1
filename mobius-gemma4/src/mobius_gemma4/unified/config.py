"""Reading a ``gemma4_unified`` (Gemma 4 12B, encoder-free) ``config.json`` (docs/gemma4.md §7).

The text part is the Gemma 4 decoder of §3 read by :func:`mobius_gemma4.config.read_text_config`
with the defaults of HF 5.24's ``Gemma4UnifiedTextConfig`` where they differ from
``Gemma4TextConfig``: no per-layer embeddings and no MoE block (the class has neither, so
keys such as ``hidden_size_per_layer_input`` that the shipped config still carries are
ignored, as HF ignores them), ``sliding_window`` 1024, ``max_position_embeddings`` 262144
and ``use_bidirectional_attention`` ``"vision"`` when absent.

The media parts are raw embedders, not towers: :class:`UnifiedVisionConfig`
(``Gemma4UnifiedVisionConfig``: 48-px merged patches → LayerNorms, a Dense, factorized
positions, RMSNorm + projection) and :class:`UnifiedAudioConfig` (``Gemma4UnifiedAudioConfig``:
640-sample frames → RMSNorm + projection). A null or absent ``vision_config`` /
``audio_config`` means no embedder, exactly as HF builds none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mobius import config_fields as cf
from mobius_gemma4.config import Gemma4Config, read_media_token_ids, read_text_config

MODEL_TYPE = "gemma4_unified"
"""The ``model_type`` of ``Gemma4UnifiedForConditionalGeneration`` checkpoints."""

# Gemma4UnifiedTextConfig defaults that differ from Gemma4TextConfig (HF 5.24).
_TEXT_DEFAULTS: dict[str, Any] = {
    "sliding_window": 1024,
    "max_position_embeddings": 262_144,
    "use_bidirectional_attention": "vision",
}
# Keys Gemma4TextConfig reads that Gemma4UnifiedTextConfig has no use for: forced off.
_TEXT_OFF: dict[str, Any] = {"hidden_size_per_layer_input": 0, "enable_moe_block": False}


@dataclass(frozen=True)
class UnifiedVisionConfig:
    """``Gemma4UnifiedVisionConfig``: the encoder-free image embedder."""

    patch_size: int = 16
    pooling_kernel_size: int = 3
    mm_embed_dim: int = 3840
    mm_posemb_size: int = 1120
    rms_norm_eps: float = 1e-6
    output_proj_dims: int = 3840
    num_soft_tokens: int = 280
    """Per-image soft-token budget of the image processor (config key ``num_soft_tokens``)."""
    layer_norm_eps: float = 1e-5
    """eps of the three ``nn.LayerNorm`` (HF constructs them with torch's default)."""

    @property
    def model_patch_size(self) -> int:
        """Side of one merged patch: ``patch_size · pooling_kernel_size`` (48)."""
        return self.patch_size * self.pooling_kernel_size

    @property
    def patch_dim(self) -> int:
        """Width of one ``pixel_values`` row: ``48 · 48 · 3 = 6912`` raw pixels (HWC)."""
        return self.model_patch_size**2 * 3


@dataclass(frozen=True)
class UnifiedAudioConfig:
    """``Gemma4UnifiedAudioConfig``: raw 40-ms frames straight into the embedder."""

    audio_embed_dim: int = 640
    """Samples per frame = feature width = embedder input (HF aliases ``hidden_size``,
    ``output_proj_dims`` and ``audio_samples_per_token`` to it)."""
    rms_norm_eps: float = 1e-6
    frame_mask = False
    """No per-frame mask output: every valid frame is one soft token."""

    @property
    def frame_width(self) -> int:
        """Width of one ``input_features`` frame: the samples of a 40-ms frame."""
        return self.audio_embed_dim


def read_unified_vision_config(raw: Mapping[str, Any], where: str) -> UnifiedVisionConfig:
    """Checked :class:`UnifiedVisionConfig`; missing keys take HF 5.24 defaults."""
    if not isinstance(raw, Mapping):
        raise cf.fail("vision_config must be a JSON object", where, "fix config.json")
    d = UnifiedVisionConfig()
    cfg = UnifiedVisionConfig(
        patch_size=cf.positive_int(raw, "patch_size", d.patch_size, where, maximum=cf.MAX_KERNEL),
        pooling_kernel_size=cf.positive_int(
            raw, "pooling_kernel_size", d.pooling_kernel_size, where, maximum=cf.MAX_KERNEL
        ),
        mm_embed_dim=cf.positive_int(raw, "mm_embed_dim", d.mm_embed_dim, where),
        mm_posemb_size=cf.positive_int(
            raw, "mm_posemb_size", d.mm_posemb_size, where, maximum=cf.MAX_POSITIONS
        ),
        rms_norm_eps=cf.finite_float(raw, "rms_norm_eps", d.rms_norm_eps, where, positive=True),
        output_proj_dims=cf.positive_int(raw, "output_proj_dims", d.output_proj_dims, where),
        num_soft_tokens=cf.positive_int(
            raw, "num_soft_tokens", d.num_soft_tokens, where, maximum=cf.MAX_POSITIONS
        ),
    )
    if "model_patch_size" in raw and raw["model_patch_size"] is not None:
        given = cf.positive_int(raw, "model_patch_size", cfg.model_patch_size, where)
        if given != cfg.model_patch_size:
            raise cf.fail(
                f"model_patch_size {given} is not patch_size {cfg.patch_size} × "
                f"pooling_kernel_size {cfg.pooling_kernel_size}",
                cf.path(where, "model_patch_size"),
                "drop model_patch_size or make it patch_size × pooling_kernel_size (HF refuses "
                "it too)",
            )
    if cfg.output_proj_dims != cfg.mm_embed_dim:
        raise cf.fail(
            f"output_proj_dims {cfg.output_proj_dims} differs from mm_embed_dim "
            f"{cfg.mm_embed_dim}: the embedder's RMSNorm + projection read the "
            "mm_embed_dim-wide patch embedding",
            cf.path(where, "output_proj_dims"),
            "set output_proj_dims equal to mm_embed_dim (12B: both 3840)",
        )
    return cfg


_AUDIO_ALIASES = ("hidden_size", "output_proj_dims", "audio_samples_per_token")


def read_unified_audio_config(raw: Mapping[str, Any], where: str) -> UnifiedAudioConfig:
    """Checked :class:`UnifiedAudioConfig`; every alias of ``audio_embed_dim`` must agree."""
    if not isinstance(raw, Mapping):
        raise cf.fail("audio_config must be a JSON object", where, "fix config.json")
    d = UnifiedAudioConfig()
    dim = cf.positive_int(raw, "audio_embed_dim", d.audio_embed_dim, where)
    for alias in _AUDIO_ALIASES:
        if raw.get(alias) is None:
            continue
        value = cf.positive_int(raw, alias, dim, where)
        if "audio_embed_dim" not in raw or raw["audio_embed_dim"] is None:
            dim = value  # HF's alias setters write audio_embed_dim
        elif value != dim:
            raise cf.fail(
                f"{alias} {value} differs from audio_embed_dim {dim} (HF treats them as one value)",
                cf.path(where, alias),
                f"make {alias} equal to audio_embed_dim or drop it",
            )
    return UnifiedAudioConfig(
        audio_embed_dim=dim,
        rms_norm_eps=cf.finite_float(raw, "rms_norm_eps", d.rms_norm_eps, where, positive=True),
    )


def unified_text_dict(raw_text: Mapping[str, Any]) -> dict[str, Any]:
    """The text config with Gemma4UnifiedTextConfig's defaults and no PLE / MoE."""
    text = dict(raw_text)
    for key, value in _TEXT_DEFAULTS.items():
        if key not in text:
            text[key] = value
    text.update(_TEXT_OFF)
    return text


def read_unified_config(raw: Mapping[str, Any]) -> Gemma4Config:
    """Read the ``config.json`` of a ``gemma4_unified`` checkpoint."""
    if not isinstance(raw, Mapping):
        raise cf.fail("config.json must hold a JSON object", "config.json", "fix config.json")
    where = "config.json"
    text = unified_text_dict(cf.mapping(raw, "text_config", where) or {})
    if "tie_word_embeddings" in raw:  # the composite config's flag governs the head
        text["tie_word_embeddings"] = raw["tie_word_embeddings"]
    ids = read_media_token_ids(raw, where)  # Gemma4UnifiedConfig's ids are Gemma4Config's
    vision = cf.mapping(raw, "vision_config", where)
    audio = cf.mapping(raw, "audio_config", where)
    return Gemma4Config(
        model_type=MODEL_TYPE,
        text=read_text_config(text, cf.path(where, "text_config")),
        vision=None
        if vision is None
        else read_unified_vision_config(vision, cf.path(where, "vision_config")),
        audio=None
        if audio is None
        else read_unified_audio_config(audio, cf.path(where, "audio_config")),
        raw=raw,
        **ids,
    )
