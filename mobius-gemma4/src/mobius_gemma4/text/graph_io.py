"""Declaring a component's ports on a graph from :mod:`mobius_gemma4.ports` specs."""

from __future__ import annotations

from mobius.components.graph import add_input, add_output
from mobius_gemma4.ports import PortSpec


def declare_inputs(builder, specs: list[PortSpec]) -> dict:
    return {name: add_input(builder, name, dtype, shape) for name, dtype, shape in specs}


def declare_outputs(builder, specs: list[PortSpec], values: dict) -> None:
    for name, dtype, shape in specs:
        add_output(builder, values[name], name, dtype=dtype, shape=shape)


def inline_constants(graph) -> None:
    """Turn every initializer that already carries data into a ``Constant`` node.

    Architecture constants (axes, shapes, scalars, ``inv_freq``) must stay inside the
    graph: onnxruntime's shape inference cannot read an axes tensor that a package writer
    moved to external data. Parameters (no data yet) stay initializers.
    """
    import onnx_ir as ir

    inputs = {id(v) for v in graph.inputs}
    lifted = []
    for value in list(graph.initializers.values()):
        if value.const_value is None or id(value) in inputs:
            continue
        graph.initializers.pop(value.name)
        lifted.append(
            ir.Node(
                "",
                "Constant",
                inputs=[],
                attributes=[ir.Attr("value", ir.AttributeType.TENSOR, value.const_value)],
                outputs=[value],
                name=f"constant/{value.name}",
            )
        )
    if lifted:
        if graph.num_nodes():
            graph.insert_before(graph.node(0), lifted)
        else:
            graph.extend(lifted)
