"""A tiny model family for core's tests: ``tinytest``, one MatMul with one weight.

``config.json`` holds ``{"model_type": "tinytest", "in_features": I, "out_features": O}``;
the checkpoint holds ``proj.weight`` of shape ``[O, I]`` (HF's ``[out, in]``); the
graph computes ``y = x @ w`` with ``w`` stored ``[I, O]``, so the weight plan
transposes. Light at import: onnx_ir and the mobius build modules are imported
inside the hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mobius import hookimpl
from mobius.errors import ConfigError
from mobius.records import ModelTypeInfo, RuntimeFile

ONNX_DTYPE = {"float32": "FLOAT", "float16": "FLOAT16", "bfloat16": "BFLOAT16"}


@dataclass(frozen=True)
class TinyConfig:
    in_features: int
    out_features: int


@hookimpl
def mobius_model_types() -> list[ModelTypeInfo]:
    return [ModelTypeInfo("tinytest", tasks=("feature-extraction",), description="test family")]


@hookimpl
def mobius_read_config(model_type: str, raw: dict[str, Any]) -> TinyConfig:
    try:
        return TinyConfig(int(raw["in_features"]), int(raw["out_features"]))
    except KeyError as exc:
        raise ConfigError(f"config.json lacks {exc.args[0]}", fix="add it") from exc


@hookimpl
def mobius_pipeline_contract(config: TinyConfig, options: Any) -> Any:
    from mobius.contract import Component, Contract, ExternalInput, Port

    dtype = options.port_dtype
    model = Component(
        "model",
        inputs=(Port("x", dtype, ("batch", config.in_features)),),
        outputs=(Port("y", dtype, ("batch", config.out_features)),),
    )
    return Contract(
        components=(model,),
        externals=(ExternalInput("model.x", "x"),),
        outputs=("model.y",),
    )


@hookimpl
def mobius_build_component(config: TinyConfig, component: str, options: Any) -> Any:
    import onnx_ir as ir

    from mobius.onnx_versions import IR_VERSION, OPSET

    dtype = getattr(ir.DataType, ONNX_DTYPE[options.port_dtype])
    x = ir.Value(name="x", type=ir.TensorType(dtype), shape=ir.Shape(["batch", config.in_features]))
    w = ir.Value(
        name="w",
        type=ir.TensorType(dtype),
        shape=ir.Shape([config.in_features, config.out_features]),
    )
    y = ir.Value(
        name="y", type=ir.TensorType(dtype), shape=ir.Shape(["batch", config.out_features])
    )
    node = ir.Node("", "MatMul", inputs=[x, w], outputs=[y])
    graph = ir.Graph(
        [x], [y], nodes=[node], initializers=[w], opset_imports={"": OPSET}, name=component
    )
    return ir.Model(graph, ir_version=IR_VERSION)


@hookimpl
def mobius_weight_plan(config: TinyConfig, component: str, checkpoint: Any, options: Any) -> Any:
    from mobius.weights import WeightPlan, ref

    plan = WeightPlan()
    plan.add("w", ref("proj.weight").transpose().cast(options.port_dtype))
    plan.ignore("proj.ignored", "kept by the checkpoint for training only")
    return plan


@hookimpl
def mobius_runtime_files(config: TinyConfig) -> list[RuntimeFile]:
    return [RuntimeFile("tinytest.txt", content=b"tiny\n")]
