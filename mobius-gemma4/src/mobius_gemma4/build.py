"""Dispatch from a contract component name to its graph builder, per target.

``--target default`` builds the portable ONNX ``Attention`` + ``RotaryEmbedding`` graph.
``cpu`` / ``cuda`` put com.microsoft GroupQueryAttention on every text layer it expresses
exactly (window on sliding layers, each type's own RoPE applied before it, KV consumers
reading the producer's cache; docs/gemma4.md §9, trap T6) and keep ``Attention`` elsewhere —
see :func:`mobius_gemma4.text.model.attention_paths`; the build logs the split.
"""

from __future__ import annotations

from mobius.errors import BuildError
from mobius.records import BuildOptions
from mobius_gemma4.config import Gemma4Config
from mobius_gemma4.contract import text_components
from mobius_gemma4.ports import MULTIMODAL_TYPES, vision_overlay


def build_component(config: Gemma4Config, component: str, options: BuildOptions):
    from mobius_gemma4.text import model

    multimodal = config.model_type in MULTIMODAL_TYPES
    if config.model_type == "gemma4_text" and component == "model":
        return model.build_causal_lm(
            config.text, options.dtype, options.target, logits=options.logits
        )
    if multimodal and component == "embedding":
        return model.build_embedding(config, options.dtype)
    if multimodal and component == "decoder":
        return model.build_decoder(
            config.text,
            options.dtype,
            block_token_ids=block_token_ids(config),
            target=options.target,
            # HF's unified forward ORs the image blocks into every layer's mask (text.model).
            overlay_full_layers=config.model_type == "gemma4_unified",
            logits=options.logits,
        )
    if component in ("vision_encoder", "audio_encoder") and component in text_components(
        config, options
    ):
        return _build_encoder(config, component, options)
    raise BuildError(
        f"{config.model_type} has no component {component!r}",
        where="mobius_gemma4.build.build_component",
        fix="gemma4_text builds 'model'; gemma4 builds 'embedding', 'decoder', and "
        "'vision_encoder' / 'audio_encoder' when config.json has vision_config / audio_config",
    )


def block_token_ids(config: Gemma4Config) -> tuple[int, ...]:
    """Token ids forming image blocks of the ``"vision"`` mask overlay (none without it)."""
    if not vision_overlay(config):
        return ()
    ids = (config.image_token_id, config.video_token_id)
    return tuple(i for i in ids if i is not None)


def _build_encoder(config: Gemma4Config, component: str, options: BuildOptions):
    hidden = config.text.hidden_size
    if config.model_type == "gemma4_unified":
        from mobius_gemma4 import unified

        if component == "vision_encoder":
            return unified.build_unified_vision_encoder(config.vision, hidden, options)
        return unified.build_unified_audio_encoder(config.audio, hidden, options)
    if component == "vision_encoder":
        from mobius_gemma4.vision import build_vision_encoder

        return build_vision_encoder(config.vision, hidden, options)
    from mobius_gemma4.audio import build_audio_encoder

    return build_audio_encoder(config.audio, hidden, options)
