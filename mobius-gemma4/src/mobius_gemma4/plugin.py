"""The mobius hook implementations of the Gemma 4 family.

Import-light on purpose: ``mobius plugins`` and ``mobius --help`` import this module, so
onnx / onnxscript / numpy-heavy builders are imported inside the hook bodies only.
"""

from __future__ import annotations

from typing import Any

from mobius import hookimpl
from mobius.errors import BuildError
from mobius.records import BuildOptions, ModelTypeInfo


@hookimpl
def mobius_model_types() -> list[ModelTypeInfo]:
    return [
        ModelTypeInfo(
            "gemma4",
            tasks=("text-generation",),
            modalities=("text", "image", "audio"),
            description="Gemma 4 (E2B, E4B, 26B-A4B, 31B): vision/audio encoders, embedding, decoder",
        ),
        ModelTypeInfo(
            "gemma4_text",
            tasks=("text-generation",),
            modalities=("text",),
            description="Gemma 4 text-only causal LM: single model graph",
        ),
        ModelTypeInfo(
            "gemma4_unified",
            tasks=("text-generation",),
            modalities=("text", "image", "audio"),
            description="Gemma 4 unified (12B, encoder-free): raw patch/frame embedders, "
            "embedding, decoder",
        ),
    ]


@hookimpl
def mobius_read_config(model_type: str, raw: dict[str, Any]):
    if model_type == "gemma4_unified":
        from mobius_gemma4.unified.config import read_unified_config

        return read_unified_config(raw)
    from mobius_gemma4.config import read_config

    return read_config(model_type, raw)


@hookimpl
def mobius_gguf_translation(architecture: str, metadata, tensors):
    """llama.cpp ``gemma4`` files, read as ``gemma4_text`` (:mod:`mobius_gemma4.gguf`)."""
    from mobius_gemma4.gguf import translate

    return translate(architecture, metadata, tensors)


@hookimpl(optionalhook=True)
def mobius_gguf_companion_translation(architecture: str, metadata, tensors, companion):
    """A ``gemma4`` file with its llama.cpp ``mmproj`` file (vision and audio encoders),
    read as ``gemma4`` (:mod:`mobius_gemma4.gguf_mmproj`). Optional: core before hook API
    1.3 has no such hook (the plugin then loads, and reads the text file alone)."""
    from mobius_gemma4.gguf_mmproj import translate_with_companion

    return translate_with_companion(architecture, metadata, tensors, companion)


@hookimpl
def mobius_pipeline_contract(config, options: BuildOptions):
    from mobius_gemma4.contract import pipeline_contract

    return pipeline_contract(config, options)


@hookimpl
def mobius_build_component(config, component: str, options: BuildOptions):
    from mobius_gemma4.build import build_component

    return build_component(config, component, options)


@hookimpl
def mobius_weight_plan(config, component: str, checkpoint, options: BuildOptions):
    from mobius_gemma4.weights.media import media_weight_plan
    from mobius_gemma4.weights.text import text_weight_plan

    if component in ("vision_encoder", "audio_encoder"):
        if config.model_type == "gemma4_unified":
            from mobius_gemma4.unified.weights import unified_weight_plan

            return unified_weight_plan(config, component, checkpoint, options)
        return media_weight_plan(config, component, options, checkpoint)
    if component not in ("model", "embedding", "decoder"):
        raise BuildError(
            f"Gemma 4 has no component {component!r}",
            where="mobius_gemma4.plugin.mobius_weight_plan",
            fix="components are model (gemma4_text); embedding, decoder, vision_encoder and "
            "audio_encoder (gemma4)",
        )
    return text_weight_plan(config, component, checkpoint, options.dtype)


@hookimpl
def mobius_quant_overrides(config, component: str, options: BuildOptions):
    from mobius_gemma4.quant import quant_overrides

    return quant_overrides(component, options.quant)


@hookimpl
def mobius_processors(config):
    from mobius_gemma4.processors import text_processors

    return text_processors(config)


@hookimpl
def mobius_runtime_files(config, contract, checkpoint, options: BuildOptions):
    from mobius_gemma4.genai_config import runtime_files

    return runtime_files(config, contract, checkpoint, options)
