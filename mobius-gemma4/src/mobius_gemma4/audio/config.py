"""``audio_config`` of a Gemma 4 checkpoint as a frozen record (reference §2.3, §6).

Every size the audio graph uses comes from here (heads, kernel, chunk, contexts,
channels, cap, eps): an earlier converter hard-coded them and broke on other
head counts (reference §12 T7). Missing keys take HF 5.24 defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def read_audio_config(raw: Mapping[str, Any], *, where: str = "config.json") -> Gemma4AudioConfig:
    """Build the record from an ``audio_config`` dict (HF 5.24 defaults for missing keys)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(
            "audio_config is not a JSON object",
            where=where,
            fix="the checkpoint's config.json must hold audio_config as an object",
        )
    d = Gemma4AudioConfig()
    channels = tuple(
        int(c) for c in raw.get("subsampling_conv_channels", d.subsampling_conv_channels)
    )
    cfg = Gemma4AudioConfig(
        hidden_size=int(raw.get("hidden_size", d.hidden_size)),
        num_hidden_layers=int(raw.get("num_hidden_layers", d.num_hidden_layers)),
        num_attention_heads=int(raw.get("num_attention_heads", d.num_attention_heads)),
        hidden_act=str(raw.get("hidden_act", d.hidden_act)),
        subsampling_conv_channels=channels,  # type: ignore[arg-type]
        conv_kernel_size=int(raw.get("conv_kernel_size", d.conv_kernel_size)),
        residual_weight=float(raw.get("residual_weight", d.residual_weight)),
        attention_chunk_size=int(raw.get("attention_chunk_size", d.attention_chunk_size)),
        attention_context_left=int(raw.get("attention_context_left", d.attention_context_left)),
        attention_context_right=int(raw.get("attention_context_right", d.attention_context_right)),
        attention_logit_cap=float(raw.get("attention_logit_cap", d.attention_logit_cap)),
        attention_invalid_logits_value=float(
            raw.get("attention_invalid_logits_value", d.attention_invalid_logits_value)
        ),
        use_clipped_linears=bool(raw.get("use_clipped_linears", d.use_clipped_linears)),
        rms_norm_eps=float(raw.get("rms_norm_eps", d.rms_norm_eps)),
        gradient_clipping=float(raw.get("gradient_clipping", d.gradient_clipping)),
        output_proj_dims=int(raw.get("output_proj_dims", d.output_proj_dims)),
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
