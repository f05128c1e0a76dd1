"""``vision_config`` of a Gemma 4 checkpoint as a frozen record (docs/gemma4.md §2.3, §5).

Read from the raw JSON, never through transformers. Missing keys take the
defaults of HF transformers 5.24 ``Gemma4VisionConfig`` so that a config that
omits a key builds exactly the tower HF would instantiate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mobius import config_fields as cf
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
    default_output_length: int | None = None
    """The checkpoint's per-image soft-token budget, when its vision_config names one."""

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch: ``3 · patch_size²``."""
        return 3 * self.patch_size * self.patch_size


_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


def read_vision_config(raw: Mapping[str, Any], *, where: str = "config.json") -> Gemma4VisionConfig:
    """Build the record from a ``vision_config`` dict; a value of the wrong JSON type is a
    ConfigError naming the section, never a bare TypeError."""
    return cf.read_section(raw, "vision_config", where, _read)


def _read(raw: Mapping[str, Any], where: str, at: str) -> Gemma4VisionConfig:
    """Build the record from a ``vision_config`` dict (HF 5.24 defaults for missing keys)."""
    d = Gemma4VisionConfig()
    # Checked readers (mobius.config_fields): wrong types and absurd sizes are
    # ConfigErrors naming the key at ``at`` (the section's path).
    rope = cf.mapping(raw, "rope_parameters", at) or {}
    rope_type = rope.get("rope_type", "axial")
    if rope_type not in ("axial", "default"):
        raise ConfigError(
            f"vision rope_type {rope_type!r} is not supported",
            where=f"{where}: vision_config.rope_parameters.rope_type",
            fix="Gemma 4 vision uses axial 2-D RoPE ('axial'; HF rewrites 'default' to it)",
        )
    hidden = cf.positive_int(raw, "hidden_size", d.hidden_size, at)
    heads = cf.positive_int(
        raw, "num_attention_heads", d.num_attention_heads, at, maximum=cf.MAX_HEADS
    )
    head_dim = raw.get("head_dim", d.head_dim)
    if head_dim is None or (cf.is_int(head_dim) and head_dim == 0):
        head_dim = hidden // heads  # HF: a null / 0 head_dim means hidden_size // heads
    cfg = Gemma4VisionConfig(
        hidden_size=hidden,
        intermediate_size=cf.positive_int(raw, "intermediate_size", d.intermediate_size, at),
        num_hidden_layers=cf.positive_int(
            raw, "num_hidden_layers", d.num_hidden_layers, at, maximum=cf.MAX_LAYERS
        ),
        num_attention_heads=heads,
        num_key_value_heads=cf.positive_int(
            raw, "num_key_value_heads", d.num_key_value_heads, at, maximum=cf.MAX_HEADS
        ),
        head_dim=cf.check_int(head_dim, cf.path(at, "head_dim"), minimum=1, maximum=cf.MAX_WIDTH),
        patch_size=cf.positive_int(raw, "patch_size", d.patch_size, at, maximum=cf.MAX_KERNEL),
        pooling_kernel_size=cf.positive_int(
            raw, "pooling_kernel_size", d.pooling_kernel_size, at, maximum=cf.MAX_KERNEL
        ),
        position_embedding_size=cf.positive_int(
            raw, "position_embedding_size", d.position_embedding_size, at, maximum=cf.MAX_POSITIONS
        ),
        use_clipped_linears=cf.boolean(raw, "use_clipped_linears", d.use_clipped_linears, at),
        standardize=cf.boolean(raw, "standardize", d.standardize, at),
        rms_norm_eps=cf.finite_float(raw, "rms_norm_eps", d.rms_norm_eps, at, positive=True),
        rope_theta=cf.finite_float(
            rope, "rope_theta", d.rope_theta, cf.path(at, "rope_parameters"), positive=True
        ),
        hidden_activation=cf.string(raw, "hidden_activation", d.hidden_activation, at),
        default_output_length=cf.optional_int(raw, "default_output_length", at),
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
