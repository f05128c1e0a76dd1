"""Port lists of every Gemma 4 component: the single source for graphs and contract alike.

Each entry is ``(name, dtype, shape)`` with symbolic dims as strings (core
:data:`mobius.lm.ports.PortSpec`). The text ports are core's :func:`mobius.lm.lm_ports`
for :func:`lm_shape` — KV ports (named by :func:`mobius.lm.kv_port`) only for the
cache-owning layers ``i < L − N_sh``, each with its own ``kvh_i`` and ``hd_i`` — with the
split package's embedding inputs in place of ``input_ids``. Each encoder's ports are
declared here once, for the contract and for its graph.
"""

from __future__ import annotations

from typing import Any

from mobius.lm.ports import BATCH, SEQ, LMShape, PortSpec, lm_ports
from mobius_gemma4.config import Gemma4Config, Gemma4TextConfig

IMAGE_ROWS, AUDIO_ROWS = "num_image_tokens", "num_audio_tokens"
MULTIMODAL_TYPES = ("gemma4", "gemma4_unified")
"""Model types packaged as the embedding + decoder split with optional encoders."""


def lm_shape(cfg: Gemma4TextConfig) -> LMShape:
    """Per-layer cache geometry; the KV consumers ``i ≥ L − N_sh`` read a producer's cache."""
    consumers = range(cfg.first_kv_shared_layer, cfg.num_hidden_layers)
    return LMShape(cfg.vocab_size, cfg.kv_heads, cfg.head_dims, frozenset(consumers))


def model_ports(
    cfg: Gemma4TextConfig, dtype: str, logits: str = "all"
) -> tuple[list[PortSpec], list[PortSpec]]:
    """Single ``model`` graph: ids in, logits + presents out (``logits="last"``: the last
    position's only, ``[batch, 1, vocab]``; core :func:`mobius.lm.lm_ports`)."""
    return lm_ports(lm_shape(cfg), dtype, logits)


def decoder_ports(
    cfg: Gemma4TextConfig, dtype: str, *, input_ids: bool = False, logits: str = "all"
) -> tuple[list[PortSpec], list[PortSpec]]:
    """``decoder`` graph: :func:`model_ports` with ``inputs_embeds`` (and, with PLE,
    ``per_layer_inputs``) for ``input_ids``; ``input_ids`` stays an input only for the
    in-graph image-block mask."""
    ins, outs = model_ports(cfg, dtype, logits)
    first: list[PortSpec] = [("inputs_embeds", dtype, (BATCH, SEQ, cfg.hidden_size))]
    if cfg.has_ple:
        first.append(("per_layer_inputs", dtype, (BATCH, SEQ, cfg.ple_width)))
    if input_ids:
        first.append(ins[0])
    return [*first, *ins[1:]], outs


def embedding_ports(
    cfg: Gemma4TextConfig, dtype: str, *, image: bool = False, audio: bool = False
) -> tuple[list[PortSpec], list[PortSpec]]:
    """``embedding`` graph of the split package; ``image`` / ``audio`` add the feature inputs
    ``[rows, H]`` that the encoders feed (zeros ``[0, H]`` when the modality is absent)."""
    outputs: list[PortSpec] = [("inputs_embeds", dtype, (BATCH, SEQ, cfg.hidden_size))]
    if cfg.has_ple:
        outputs.append(("per_layer_inputs", dtype, (BATCH, SEQ, cfg.ple_width)))
    inputs: list[PortSpec] = [("input_ids", "int64", (BATCH, SEQ))]
    if image:
        inputs.append(("image_features", dtype, (IMAGE_ROWS, cfg.hidden_size)))
    if audio:
        inputs.append(("audio_features", dtype, (AUDIO_ROWS, cfg.hidden_size)))
    return inputs, outputs


def vision_ports(vision: Any, hidden: int, dtype: str) -> tuple[list[PortSpec], list[PortSpec]]:
    """``vision_encoder`` (tower or unified embedder, ``vision.patch_dim`` wide patches):
    patches + (x, y) positions in, soft tokens ``[rows, hidden]`` out."""
    inputs: list[PortSpec] = [
        ("pixel_values", dtype, (BATCH, "num_patches", vision.patch_dim)),
        ("pixel_position_ids", "int64", (BATCH, "num_patches", 2)),
    ]
    return inputs, [("image_features", dtype, (IMAGE_ROWS, hidden))]


def audio_ports(audio: Any, hidden: int, dtype: str) -> tuple[list[PortSpec], list[PortSpec]]:
    """``audio_encoder``: frames ``[batch, time, audio.frame_width]`` + bool mask in, valid
    soft tokens ``[rows, hidden]`` out; the Conformer tower also gives the diagnostic
    per-frame ``audio_features_mask``."""
    inputs: list[PortSpec] = [
        ("input_features", dtype, (BATCH, "time", audio.frame_width)),
        ("input_features_mask", "bool", (BATCH, "time")),
    ]
    outputs: list[PortSpec] = [("audio_features", dtype, (AUDIO_ROWS, hidden))]
    if audio.frame_mask:
        outputs.append(("audio_features_mask", "bool", (BATCH, "audio_frames")))
    return inputs, outputs


def has_vision(config: Gemma4Config) -> bool:
    """A multimodal package builds ``vision_encoder`` iff config.json has ``vision_config``."""
    return config.model_type in MULTIMODAL_TYPES and config.vision is not None


def has_audio(config: Gemma4Config) -> bool:
    """A multimodal package builds ``audio_encoder`` iff ``audio_config`` is non-null."""
    return config.model_type in MULTIMODAL_TYPES and config.audio is not None


def vision_overlay(config: Gemma4Config) -> bool:
    """Sliding layers see whole image blocks (``use_bidirectional_attention = "vision"``).

    Only meaningful with a vision tower: without one no prompt can hold image tokens.
    The decoder then derives block ids from ``input_ids`` in-graph (docs/gemma4.md §4).
    """
    return has_vision(config) and config.text.use_bidirectional_attention == "vision"


def encoder_ports(config: Gemma4Config, component: str, dtype: str):
    """The ports of ``vision_encoder`` / ``audio_encoder`` of ``config``."""
    if component == "vision_encoder":
        return vision_ports(config.vision, config.text.hidden_size, dtype)
    return audio_ports(config.audio, config.text.hidden_size, dtype)
