"""``audio_config`` of a Gemma 4 checkpoint as a frozen record (docs/gemma4.md §2.3, §6).

Every size the audio graph uses comes from here (heads, kernel, chunk, contexts,
channels, cap, eps): an earlier converter hard-coded them and broke on other
head counts (docs/gemma4.md §12 T7). Missing keys take HF 5.24 defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mobius import config_fields as cf
from mobius.errors import ConfigError


@dataclass(frozen=True)
class Gemma4AudioConfig:
    """Geometry of the audio tower (``Gemma4AudioModel``)."""

    hidden_size: int = 1024
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    hidden_act: str = "silu"
    subsampling_conv_channels: tuple[int, int] = (128, 32)
    conv_kernel_size: int = 5
    residual_weight: float = 0.5
    attention_chunk_size: int = 12
    attention_context_left: int = 13
    attention_context_right: int = 0
    attention_logit_cap: float = 50.0
    attention_invalid_logits_value: float = -1.0e9
    use_clipped_linears: bool = True
    rms_norm_eps: float = 1e-6
    gradient_clipping: float = 1e10
    output_proj_dims: int = 1536
    num_mel_bins: int = 128
    """Feature width of ``input_features`` (the feature extractor's ``feature_size``)."""

    frame_mask = True
    """The tower also outputs the per-frame ``audio_features_mask`` (see ports)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def frame_width(self) -> int:
        """Width of one ``input_features`` frame: the mel bins."""
        return self.num_mel_bins


def read_audio_config(raw: Mapping[str, Any], *, where: str = "config.json") -> Gemma4AudioConfig:
    """Build the record from an ``audio_config`` dict; a value of the wrong JSON type is a
    ConfigError naming the section, never a bare TypeError."""
    return cf.read_section(raw, "audio_config", where, _read)


def _read(raw: Mapping[str, Any], where: str, at: str) -> Gemma4AudioConfig:
    """Build the record from an ``audio_config`` dict (HF 5.24 defaults for missing keys)."""
    d = Gemma4AudioConfig()
    # Checked readers (mobius.config_fields): wrong types and absurd sizes are
    # ConfigErrors naming the key at ``at`` (the section's path).
    channels = cf.int_list(raw, "subsampling_conv_channels", at, minimum=1, max_len=8) or tuple(
        d.subsampling_conv_channels
    )
    window = cf.MAX_KERNEL  # chunk and context sizes shape the [chunk, context] score blocks
    cfg = Gemma4AudioConfig(
        hidden_size=cf.positive_int(raw, "hidden_size", d.hidden_size, at),
        num_hidden_layers=cf.positive_int(
            raw, "num_hidden_layers", d.num_hidden_layers, at, maximum=cf.MAX_LAYERS
        ),
        num_attention_heads=cf.positive_int(
            raw, "num_attention_heads", d.num_attention_heads, at, maximum=cf.MAX_HEADS
        ),
        hidden_act=cf.string(raw, "hidden_act", d.hidden_act, at),
        subsampling_conv_channels=channels,  # type: ignore[arg-type]
        conv_kernel_size=cf.positive_int(
            raw, "conv_kernel_size", d.conv_kernel_size, at, maximum=cf.MAX_KERNEL
        ),
        residual_weight=cf.finite_float(raw, "residual_weight", d.residual_weight, at),
        attention_chunk_size=cf.positive_int(
            raw, "attention_chunk_size", d.attention_chunk_size, at, maximum=window
        ),
        # HF attends to context_left - 1 past frames, so 0 would mean -1.
        attention_context_left=cf.positive_int(
            raw, "attention_context_left", d.attention_context_left, at, maximum=window
        ),
        attention_context_right=cf.nonneg_int(
            raw, "attention_context_right", d.attention_context_right, at, maximum=window
        ),
        attention_logit_cap=cf.finite_float(
            raw, "attention_logit_cap", d.attention_logit_cap, at, positive=True
        ),
        attention_invalid_logits_value=cf.finite_float(
            raw, "attention_invalid_logits_value", d.attention_invalid_logits_value, at
        ),
        use_clipped_linears=cf.boolean(raw, "use_clipped_linears", d.use_clipped_linears, at),
        rms_norm_eps=cf.finite_float(raw, "rms_norm_eps", d.rms_norm_eps, at, positive=True),
        gradient_clipping=cf.finite_float(
            raw, "gradient_clipping", d.gradient_clipping, at, positive=True
        ),
        output_proj_dims=cf.positive_int(raw, "output_proj_dims", d.output_proj_dims, at),
    )
    if len(channels) != 2 or channels[0] != cfg.num_mel_bins:
        raise ConfigError(
            f"audio subsampling_conv_channels {list(channels)} is not supported",
            where=f"{where}: audio_config.subsampling_conv_channels",
            fix=f"HF sizes input_proj_linear as channels[0]//4·channels[1], which needs "
            f"two stages with channels[0] == {cfg.num_mel_bins} (the mel bins)",
        )
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ConfigError(
            "audio hidden_size is not a multiple of num_attention_heads",
            where=f"{where}: audio_config",
            fix="use a head count that divides hidden_size",
        )
    if cfg.hidden_act not in ("silu", "swish"):
        raise ConfigError(
            f"audio hidden_act {cfg.hidden_act!r} is not supported",
            where=f"{where}: audio_config.hidden_act",
            fix="Gemma 4 audio uses silu",
        )
    return cfg
