"""Starting and finishing an ONNX graph the way every mobius component graph is made.

A builder plugin calls :func:`new_graph`, declares inputs with :func:`add_input`
(symbolic dims are strings), runs its modules with the returned ``op``, names the
outputs with :func:`add_output` and wraps the result with :func:`finish_model`.
Going through these helpers is what guarantees every graph carries the pinned
opsets and IR version of :mod:`mobius.onnx_versions` (onnxruntime 1.31 refuses
newer IR versions) and exact port names that a pipeline contract can refer to.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
import onnxscript
from onnxscript import GraphBuilder, OpBuilder, nn

from mobius.components.dtypes import ir_dtype
from mobius.onnx_versions import IR_VERSION, MS_OPSET, OPSET

MS_DOMAIN = "com.microsoft"
"""Domain of onnxruntime's contrib ops (``GroupQueryAttention``, …)."""

Dim = int | str | None


def new_graph(name: str) -> tuple[ir.Graph, GraphBuilder, OpBuilder]:
    """Start an empty graph named ``name`` importing ai.onnx OPSET and com.microsoft MS_OPSET.

    Returns ``(graph, builder, op)``; ``op`` builds default-domain nodes
    (``op.MatMul(a, b)``) and is what every module's ``forward`` receives.
    Use :func:`ms_opset` for contrib ops.
    """
    graph = ir.Graph(
        inputs=[],
        outputs=[],
        nodes=[],
        name=name,
        opset_imports={"": OPSET, MS_DOMAIN: MS_OPSET},
    )
    builder = onnxscript.GraphBuilder(graph)
    return graph, builder, builder.op


def ms_opset(op: OpBuilder) -> OpBuilder:
    """An ``OpBuilder`` for the com.microsoft domain on the same graph as ``op``."""
    return op.builder.opset(MS_DOMAIN, MS_OPSET)


def add_input(
    builder: GraphBuilder | OpBuilder,
    name: str,
    dtype: str | ir.DataType,
    shape: Sequence[Dim],
) -> ir.Value:
    """Declare graph input ``name`` of port dtype ``dtype`` (``"float32"``, ``"int64"``, …).

    ``shape`` mixes static ints and symbolic strings, e.g. ``("batch", "sequence_len")``.
    """
    gb = builder.builder if isinstance(builder, OpBuilder) else builder
    return gb.input(name, dtype=ir_dtype(dtype), shape=ir.Shape(list(shape)))


def add_output(
    builder: GraphBuilder | OpBuilder,
    value: ir.Value,
    name: str,
    *,
    dtype: str | ir.DataType | None = None,
    shape: Sequence[Dim] | None = None,
) -> ir.Value:
    """Make ``value`` a graph output called exactly ``name`` and return the output value.

    A value that already is a graph input, an initializer (or a module Parameter) or
    another output is routed through an ``Identity`` first, so renaming never changes
    another port.
    ``dtype``/``shape`` (optional) replace what shape inference found, e.g. to
    give the output symbolic dims that match the contract.
    """
    gb = builder.builder if isinstance(builder, OpBuilder) else builder
    graph = gb.graph
    if (
        isinstance(value, nn.Parameter)
        or value.is_graph_input()
        or value.is_initializer()
        or value.is_graph_output()
    ):
        value = gb.op.Identity(value)
    value.name = name
    if dtype is not None:
        value.type = ir.TensorType(ir_dtype(dtype))
    if shape is not None:
        value.shape = ir.Shape(list(shape))
    if value.type is None or value.shape is None:
        raise ValueError(
            f"graph output {name!r} has no inferred dtype/shape; pass dtype= and shape= to add_output"
        )
    graph.outputs.append(value)
    return value


def constant(
    op: OpBuilder | GraphBuilder, array: np.ndarray, name: str, *, qualify: bool = True
) -> ir.Value:
    """Store a numpy array as an initializer of the graph and return its value.

    The name is qualified with the current module scope (like a Parameter) unless
    ``qualify`` is false. Use it for tables computed at build time (rotary caches, masks).
    """
    gb = op.builder if isinstance(op, OpBuilder) else op
    tensor = ir.tensor(np.ascontiguousarray(array), name=name)
    return gb.initializer(tensor, name, qualify=qualify)


def finish_model(
    graph: ir.Graph,
    *,
    builder: GraphBuilder | None = None,
    producer_name: str = "mobius",
) -> ir.Model:
    """Wrap ``graph`` in an ``ir.Model`` with mobius's pinned IR version and opsets.

    Pass ``builder`` when the graph calls functions made with ``op.call`` so that
    their definitions are carried in the model.
    """
    graph.opset_imports[""] = OPSET
    graph.opset_imports.setdefault(MS_DOMAIN, MS_OPSET)
    functions = list(builder.functions.values()) if builder is not None else []
    return ir.Model(
        graph,
        ir_version=IR_VERSION,
        producer_name=producer_name,
        functions=functions,
    )
