"""The mobius hook implementations of the Qwen3 family (``qwen3``, ``qwen3_moe``).

Import-light on purpose: ``mobius plugins`` and ``mobius --help`` import this module, so
the graph builders (onnx_ir, onnxscript) are imported inside the hook bodies.
"""

from __future__ import annotations

from typing import Any

from mobius import hookimpl
from mobius.lm.runtime import check_component, runtime_files, text_processors
from mobius.records import BuildOptions, ModelTypeInfo


@hookimpl
def mobius_model_types() -> list[ModelTypeInfo]:
    return [
        ModelTypeInfo(
            "qwen3",
            tasks=("text-generation",),
            modalities=("text",),
            description="Qwen3 dense causal LM (0.6B … 32B): one model graph",
        ),
        ModelTypeInfo(
            "qwen3_moe",
            tasks=("text-generation",),
            modalities=("text",),
            description="Qwen3-MoE causal LM (30B-A3B, 235B-A22B): routed SiLU experts",
        ),
    ]


@hookimpl
def mobius_read_config(model_type: str, raw: dict[str, Any]):
    from mobius_qwen3.config import read_config

    return read_config(model_type, raw)


@hookimpl
def mobius_pipeline_contract(config, options: BuildOptions):
    from mobius_qwen3.contract import pipeline_contract

    return pipeline_contract(config, options)


@hookimpl
def mobius_build_component(config, component: str, options: BuildOptions):
    from mobius_qwen3.model import build_model

    check_component(config, component, "mobius_qwen3.plugin.mobius_build_component", "Qwen3")
    return build_model(config, options.dtype, options.target)


@hookimpl
def mobius_weight_plan(config, component: str, checkpoint, options: BuildOptions):
    from mobius_qwen3.weights import weight_plan

    check_component(config, component, "mobius_qwen3.plugin.mobius_weight_plan", "Qwen3")
    return weight_plan(config, checkpoint, options.port_dtype)


@hookimpl
def mobius_processors(config):
    from mobius_qwen3.processors import format_chat_prompt

    return text_processors(config, format_chat_prompt)


@hookimpl
def mobius_runtime_files(config, contract, checkpoint, options: BuildOptions):
    # genai_config.json; tokenizer files and the chat template: core copies them
    return runtime_files(config, checkpoint, "qwen3")
