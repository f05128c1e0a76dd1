"""``vision_config`` of a Gemma 4 checkpoint as a frozen record (reference §2.3, §5).

Read from the raw JSON, never through transformers. Missing keys take the
defaults of HF transformers 5.24 ``Gemma4VisionConfig`` so that a config that
omits a key builds exactly the tower HF would instantiate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mobius.errors import ConfigError


@dataclass(frozen=True)
class Gemma4VisionConfig:
    """Geometry of the vision tower (``Gemma4VisionModel``)."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 16
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    head_dim: int = 64
    patch_size: int = 16
    pooling_kernel_size: int = 3
    position_embedding_size: int = 10240
    use_clipped_linears: bool = False
    standardize: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 100.0
    hidden_activation: str = "gelu_pytorch_tanh"

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch: ``3 · patch_size²``."""
        return 3 * self.patch_size * self.patch_size


_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


def read_vision_config(raw: Mapping[str, Any], *, where: str = "config.json") -> Gemma4VisionConfig:
    """Build the record from a ``vision_config`` dict (HF 5.24 defaults for missing keys)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(
            "vision_config is not a JSON object",
            where=where,
            fix="the checkpoint's config.json must hold vision_config as an object",
        )
    d = Gemma4VisionConfig()
    rope = raw.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", "axial")
    if rope_type not in ("axial", "default"):
        raise ConfigError(
            f"vision rope_type {rope_type!r} is not supported",
            where=f"{where}: vision_config.rope_parameters.rope_type",
            fix="Gemma 4 vision uses axial 2-D RoPE ('axial'; HF rewrites 'default' to it)",
        )
    hidden = int(raw.get("hidden_size", d.hidden_size))
    heads = int(raw.get("num_attention_heads", d.num_attention_heads))
    head_dim = raw.get("head_dim", d.head_dim) or hidden // heads
    cfg = Gemma4VisionConfig(
        hidden_size=hidden,
        intermediate_size=int(raw.get("intermediate_size", d.intermediate_size)),
        num_hidden_layers=int(raw.get("num_hidden_layers", d.num_hidden_layers)),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads", d.num_key_value_heads)),
        head_dim=int(head_dim),
        patch_size=int(raw.get("patch_size", d.patch_size)),
        pooling_kernel_size=int(raw.get("pooling_kernel_size", d.pooling_kernel_size)),
        position_embedding_size=int(raw.get("position_embedding_size", d.position_embedding_size)),
        use_clipped_linears=bool(raw.get("use_clipped_linears", d.use_clipped_linears)),
        standardize=bool(raw.get("standardize", d.standardize)),
        rms_norm_eps=float(raw.get("rms_norm_eps", d.rms_norm_eps)),
        rope_theta=float(rope.get("rope_theta", d.rope_theta)),
        hidden_activation=str(raw.get("hidden_activation", d.hidden_activation)),
    )
    if cfg.head_dim % 4:
        raise ConfigError(
            f"vision head_dim {cfg.head_dim} is not a multiple of 4",
            where=f"{where}: vision_config.head_dim",
            fix="2-D RoPE splits each head into x and y halves of rotate-half pairs",
        )
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ConfigError(
            "vision num_attention_heads is not a multiple of num_key_value_heads",
            where=f"{where}: vision_config",
            fix="use a head count divisible by the KV head count",
        )
    if cfg.hidden_activation not in _ACTIVATIONS:
        raise ConfigError(
            f"vision hidden_activation {cfg.hidden_activation!r} is not supported",
            where=f"{where}: vision_config.hidden_activation",
            fix=f"use one of {', '.join(_ACTIVATIONS)}",
        )
    return cfg
