"""The hooks of the ``tinymlp`` example family, in the order mobius calls them.

A package built from a ``tinymlp`` checkpoint has one component, ``model``:
``features [batch, in_features] -> logits [batch, num_labels]``, computed as
``fc2(relu(fc1(features)))``. Everything a family plugin must say is here: which
model type it serves, how to read its config, the pipeline contract, the graph,
and where each weight comes from. Keep module-level imports light (only
``mobius``): this module is imported whenever the ``mobius`` CLI starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mobius
from mobius.errors import ConfigError
from mobius.records import BuildOptions, ModelTypeInfo

MODEL_TYPE = "tinymlp"
COMPONENT = "model"


@dataclass(frozen=True)
class MLPConfig:
    """The typed config, parsed from ``config.json`` without transformers."""

    in_features: int
    hidden_size: int
    num_labels: int


@mobius.hookimpl
def mobius_model_types() -> list[ModelTypeInfo]:
    """Claim ``tinymlp``: mobius routes every per-model hook for it to this plugin."""
    return [
        ModelTypeInfo(
            MODEL_TYPE,
            tasks=("classification",),
            modalities=("features",),
            description="two-layer MLP classifier (example)",
        )
    ]


@mobius.hookimpl
def mobius_read_config(model_type: str, raw: dict[str, Any]) -> MLPConfig:
    """Validate the three sizes; a bad value is the user's to fix, so say where."""
    values = {}
    for key in ("in_features", "hidden_size", "num_labels"):
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(
                f"{model_type} config needs a positive integer {key!r}, got {value!r}",
                where=f"config.json: {key}",
                fix=f'set "{key}" to a positive integer',
            )
        values[key] = value
    return MLPConfig(**values)


@mobius.hookimpl
def mobius_pipeline_contract(config: MLPConfig, options: BuildOptions) -> Any:
    """One component; the caller feeds ``features`` and reads ``logits``."""
    from mobius.contract import Component, Contract, ExternalInput, Port

    dtype = options.port_dtype
    model = Component(
        name=COMPONENT,
        inputs=(Port("features", dtype, ("batch", config.in_features)),),
        outputs=(Port("logits", dtype, ("batch", config.num_labels)),),
    )
    return Contract(
        components=(model,),
        externals=(ExternalInput(consumer=f"{COMPONENT}.features", name="features"),),
        outputs=(f"{COMPONENT}.logits",),
    )


@mobius.hookimpl
def mobius_build_component(config: MLPConfig, component: str, options: BuildOptions) -> Any:
    """Construct the graph with mobius's shared ``Linear``; parameters stay unbound."""
    from mobius.components import Linear, add_input, add_output, finish_model, new_graph

    if component != COMPONENT:
        raise ConfigError(
            f"{MODEL_TYPE} has no component {component!r}",
            where="pipeline contract",
            fix=f"use the component {COMPONENT!r}",
        )
    dtype = options.port_dtype
    graph, builder, op = new_graph(f"{MODEL_TYPE}_{COMPONENT}")
    features = add_input(op, "features", dtype, ("batch", config.in_features))
    fc1 = Linear(config.in_features, config.hidden_size, bias=True, dtype=dtype, name="fc1")
    fc2 = Linear(config.hidden_size, config.num_labels, bias=True, dtype=dtype, name="fc2")
    hidden = op.Relu(fc1(op, features))
    add_output(op, fc2(op, hidden), "logits", shape=("batch", config.num_labels))
    return finish_model(graph, builder=builder)


@mobius.hookimpl
def mobius_weight_plan(
    config: MLPConfig, component: str, checkpoint: Any, options: BuildOptions
) -> Any:
    """Map each initializer to a checkpoint tensor, lazily.

    The checkpoint stores ``nn.Linear`` weights ``[out, in]``; mobius's ``Linear``
    wants ``[in, out]`` (a plain MatMul), so the plan transposes. Casting to the
    build dtype happens here too. Nothing is read until the package is written.
    """
    from mobius.weights import WeightPlan, ref

    dtype = options.port_dtype
    plan = WeightPlan()
    for layer in ("fc1", "fc2"):
        plan.add(f"{layer}.weight", ref(f"{layer}.weight").transpose().cast(dtype))
        plan.add(f"{layer}.bias", ref(f"{layer}.bias").cast(dtype))
    return plan
