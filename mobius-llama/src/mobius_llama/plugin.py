"""The mobius hooks of the Llama family (``llama``, ``mistral``): core's decoder-LM kit.

Import-light on purpose: ``mobius plugins`` and ``mobius --help`` import this module, so
the graph builders (onnx_ir, onnxscript, under :mod:`mobius.lm.decoder`) are imported
inside the hook bodies. The layer is :class:`mobius.lm.decoder.DecoderLM` as it stands
(HF 5.24 ``LlamaDecoderLayer`` / ``MistralDecoderLayer``: no q/k norms, gated SiLU MLP);
onnxruntime-genai runs the package as its model type ``llama`` / ``mistral``. Prompts
come from the checkpoint's chat template (core copies it; Llama 2 and 3 lay chats out
differently), else the text as given.
"""

from __future__ import annotations

from typing import Any

from mobius import hookimpl
from mobius.lm.runtime import check_component, runtime_files, text_processors
from mobius.records import BuildOptions, ModelTypeInfo

FAMILY = "Llama"


@hookimpl
def mobius_model_types() -> list[ModelTypeInfo]:
    return [
        ModelTypeInfo(
            "llama",
            tasks=("text-generation",),
            modalities=("text",),
            description="Llama 2 / 3 / 3.1 / 3.2 causal LM (SmolLM, TinyLlama, …): one model graph",
        ),
        ModelTypeInfo(
            "mistral",
            tasks=("text-generation",),
            modalities=("text",),
            description="Mistral causal LM (7B v0.1 … v0.3): sliding window when set",
        ),
    ]


@hookimpl
def mobius_read_config(model_type: str, raw: dict[str, Any]):
    from mobius_llama.config import read_config

    return read_config(model_type, raw)


@hookimpl
def mobius_pipeline_contract(config, options: BuildOptions):
    from mobius.lm.decoder import decoder_shape
    from mobius.lm.ports import lm_contract

    return lm_contract(decoder_shape(config), options.port_dtype)


@hookimpl
def mobius_build_component(config, component: str, options: BuildOptions):
    from mobius.lm.decoder import build_decoder

    check_component(config, component, "mobius_llama.plugin.mobius_build_component", FAMILY)
    return build_decoder(config, options.dtype, options.target, family=config.model_type)


@hookimpl
def mobius_weight_plan(config, component: str, checkpoint, options: BuildOptions):
    from mobius.lm.weights import decoder_plan

    check_component(config, component, "mobius_llama.plugin.mobius_weight_plan", FAMILY)
    return decoder_plan(config, checkpoint, options.port_dtype)


@hookimpl
def mobius_processors(config):
    return text_processors(config, None)


@hookimpl
def mobius_runtime_files(config, contract, checkpoint, options: BuildOptions):
    # genai_config.json; tokenizer files and the chat template: core copies them
    return runtime_files(config, checkpoint, config.model_type)
