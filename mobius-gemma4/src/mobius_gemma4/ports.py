"""Port lists of every text component: the single source for graphs and contract alike.

Each entry is ``(name, dtype, shape)`` with symbolic dims as strings. KV ports exist only
for cache-owning layers ``i < L − N_sh`` with that layer's static ``kvh_i`` and ``hd_i``.
"""

from __future__ import annotations

from mobius_gemma4.config import Gemma4Config, Gemma4TextConfig

PortSpec = tuple[str, str, tuple[int | str, ...]]

BATCH, SEQ, PAST, TOTAL = "batch", "sequence_len", "past_sequence_len", "total_sequence_len"


def kv_inputs(cfg: Gemma4TextConfig, dtype: str) -> list[PortSpec]:
    out: list[PortSpec] = []
    for i in range(cfg.num_cache_layers):
        shape = (BATCH, cfg.kv_heads[i], PAST, cfg.head_dims[i])
        out += [
            (f"past_key_values.{i}.key", dtype, shape),
            (f"past_key_values.{i}.value", dtype, shape),
        ]
    return out


def kv_outputs(cfg: Gemma4TextConfig, dtype: str) -> list[PortSpec]:
    out: list[PortSpec] = []
    for i in range(cfg.num_cache_layers):
        shape = (BATCH, cfg.kv_heads[i], TOTAL, cfg.head_dims[i])
        out += [(f"present.{i}.key", dtype, shape), (f"present.{i}.value", dtype, shape)]
    return out


def _common_inputs() -> list[PortSpec]:
    return [("attention_mask", "int64", (BATCH, TOTAL)), ("position_ids", "int64", (BATCH, SEQ))]


def logits_port(cfg: Gemma4TextConfig, dtype: str) -> PortSpec:
    return ("logits", dtype, (BATCH, SEQ, cfg.vocab_size))


def model_ports(cfg: Gemma4TextConfig, dtype: str) -> tuple[list[PortSpec], list[PortSpec]]:
    """Single ``model`` graph: ids in, logits + presents out."""
    inputs = [("input_ids", "int64", (BATCH, SEQ)), *_common_inputs(), *kv_inputs(cfg, dtype)]
    return inputs, [logits_port(cfg, dtype), *kv_outputs(cfg, dtype)]


IMAGE_ROWS, AUDIO_ROWS = "num_image_tokens", "num_audio_tokens"
MULTIMODAL_TYPES = ("gemma4", "gemma4_unified")
"""Model types packaged as the embedding + decoder split with optional encoders."""


def has_vision(config: Gemma4Config) -> bool:
    """A ``gemma4`` package builds ``vision_encoder`` iff the checkpoint has a vision tower."""
    return config.model_type in MULTIMODAL_TYPES and config.vision_config is not None


def has_audio(config: Gemma4Config) -> bool:
    """A ``gemma4`` package builds ``audio_encoder`` iff ``audio_config`` is non-null."""
    return config.model_type in MULTIMODAL_TYPES and config.audio_config is not None


def vision_overlay(config: Gemma4Config) -> bool:
    """Sliding layers see whole image blocks (``use_bidirectional_attention = "vision"``).

    Only meaningful with a vision tower: without one no prompt can hold image tokens.
    The decoder then derives block ids from ``input_ids`` in-graph (docs/gemma4.md §4).
    """
    return has_vision(config) and config.text.use_bidirectional_attention == "vision"


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


def decoder_ports(
    cfg: Gemma4TextConfig, dtype: str, *, input_ids: bool = False
) -> tuple[list[PortSpec], list[PortSpec]]:
    """``decoder`` graph; ``input_ids`` is an input only for the in-graph image-block mask."""
    inputs: list[PortSpec] = [("inputs_embeds", dtype, (BATCH, SEQ, cfg.hidden_size))]
    if cfg.has_ple:
        inputs.append(("per_layer_inputs", dtype, (BATCH, SEQ, cfg.ple_width)))
    if input_ids:
        inputs.append(("input_ids", "int64", (BATCH, SEQ)))
    inputs += [*_common_inputs(), *kv_inputs(cfg, dtype)]
    return inputs, [logits_port(cfg, dtype), *kv_outputs(cfg, dtype)]


def vision_ports(config: Gemma4Config, dtype: str) -> tuple[list[PortSpec], list[PortSpec]]:
    """``vision_encoder``: patches + (x, y) positions in, pooled soft tokens ``[rows, H]`` out."""
    if config.model_type == "gemma4_unified":
        from mobius_gemma4.unified import vision_config_of
        from mobius_gemma4.unified import vision_ports as unified_vision_ports

        return unified_vision_ports(vision_config_of(config), config.text.hidden_size, dtype)
    from mobius_gemma4.vision.config import read_vision_config

    vc = read_vision_config(config.vision_config, where="config.json: vision_config")
    inputs: list[PortSpec] = [
        ("pixel_values", dtype, (BATCH, "num_patches", vc.patch_dim)),
        ("pixel_position_ids", "int64", (BATCH, "num_patches", 2)),
    ]
    return inputs, [("image_features", dtype, (IMAGE_ROWS, config.text.hidden_size))]


def audio_ports(config: Gemma4Config, dtype: str) -> tuple[list[PortSpec], list[PortSpec]]:
    """``audio_encoder``: log-mel frames + bool mask in, valid soft tokens ``[rows, H]`` out
    (plus the diagnostic per-frame ``audio_features_mask``)."""
    if config.model_type == "gemma4_unified":
        from mobius_gemma4.unified import audio_config_of
        from mobius_gemma4.unified import audio_ports as unified_audio_ports

        return unified_audio_ports(audio_config_of(config), config.text.hidden_size, dtype)
    from mobius_gemma4.audio.config import read_audio_config

    ac = read_audio_config(config.audio_config, where="config.json: audio_config")
    inputs: list[PortSpec] = [
        ("input_features", dtype, (BATCH, "time", ac.num_mel_bins)),
        ("input_features_mask", "bool", (BATCH, "time")),
    ]
    outputs: list[PortSpec] = [
        ("audio_features", dtype, (AUDIO_ROWS, config.text.hidden_size)),
        ("audio_features_mask", "bool", (BATCH, "audio_frames")),
    ]
    return inputs, outputs
