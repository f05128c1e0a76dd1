"""The mobius hook implementations of the Qwen3 family (``qwen3``, ``qwen3_moe``).

Import-light on purpose: ``mobius plugins`` and ``mobius --help`` import this module, so
the graph builders (onnx_ir, onnxscript) are imported inside the hook bodies.
"""

from __future__ import annotations

from typing import Any

from mobius import hookimpl
from mobius.errors import BuildError
from mobius.records import BuildOptions, ModelTypeInfo

COMPONENT = "model"


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


def _check_component(config, component: str, hook: str) -> None:
    if component != COMPONENT:
        raise BuildError(
            f"{config.model_type} has no component {component!r}",
            where=f"mobius_qwen3.plugin.{hook}",
            fix="a Qwen3 package has one component, 'model'",
        )


@hookimpl
def mobius_build_component(config, component: str, options: BuildOptions):
    from mobius_qwen3.model import build_model

    _check_component(config, component, "mobius_build_component")
    return build_model(config, options.dtype, options.target)


@hookimpl
def mobius_weight_plan(config, component: str, checkpoint, options: BuildOptions):
    from mobius_qwen3.weights import weight_plan

    _check_component(config, component, "mobius_weight_plan")
    return weight_plan(config, checkpoint, options.port_dtype)


@hookimpl
def mobius_processors(config):
    from mobius_qwen3.processors import processors

    return processors(config)


@hookimpl
def mobius_runtime_files(config, contract, checkpoint, options: BuildOptions):
    from mobius_qwen3.runtime_files import runtime_files

    return runtime_files(config, checkpoint, options)


@hookimpl(optionalhook=True)  # optional: a core before hook API 1.2 has no such hook
def mobius_gguf_translation(architecture: str, metadata, tensors):
    from mobius_qwen3.gguf import translate

    return translate(architecture, metadata, tensors)
