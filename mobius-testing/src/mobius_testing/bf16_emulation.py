"""Run a bfloat16-compute ONNX graph on onnxruntime CPU by emulating bf16 in float32.

onnxruntime's CPU provider has no bfloat16 kernels for most ops (``Mul``, ``Add``,
``MatMul``…), so a ``mobius build --dtype bf16`` package cannot be measured on a
CPU-only machine. :func:`emulate_bf16` rewrites such a graph into an equivalent
float32 graph that reproduces bf16 *storage* rounding:

- every bfloat16 tensor type (graph inputs / outputs, initializers, intermediate
  values, subgraph values) becomes float32; initializer and constant data is
  widened exactly (every bf16 value is a float32 value);
- ``to`` / ``dtype`` attributes naming bfloat16 become float32, tensor attributes
  (``Constant.value``, ``ConstantOfShape.value``) are widened;
- after every node output that was bfloat16, a ``Cast(to=BFLOAT16)`` →
  ``Cast(to=FLOAT)`` pair rounds the value to the nearest bf16 (ties to even;
  onnxruntime CPU implements both casts, and does not fold the lossy pair away);
- ``Cast(to=BFLOAT16)`` and ``CastLike`` to a bf16 target keep their exact
  single rounding (a direct cast to bf16, then a widening cast), so an int or
  f32 source is not double-rounded;
- bf16 graph inputs are rounded on entry, so a caller may feed any float32.

What this reproduces, and what it cannot:

- Element-wise chains round after each op, exactly as a bf16 kernel stores its
  output: a bf16 ``Mul``/``Add`` chain is bit-identical to numpy with
  ``ml_dtypes.bfloat16`` rounding after each step.
- Inside one op the arithmetic runs in float32 and only the op's output is
  rounded. That matches cuBLAS bf16 GEMMs (f32 accumulation), and the usual CUDA
  reductions / softmax / attention kernels (f32 internally); a kernel that
  keeps bf16 intermediates (e.g. a bf16 rotary or a bf16-accumulating reduction)
  would differ from this emulation by a few bf16 ulps. Attention's internal
  softmax precision also differs between providers anyway.
- Ops that only move or select values (``Reshape``, ``Transpose``, ``Gather``,
  ``Concat``, ``Where``, ``Max``…) get no rounding: their inputs are already bf16
  values, so the output is too (the rewrite keeps that invariant everywhere).
- Sessions over an emulated graph should disable onnxruntime's graph fusions
  (``ORT_DISABLE_ALL``, see :func:`emulation_session_options`): a fusion such as
  SimplifiedLayerNormalization could swallow a rounding pair and compute a span
  of ops in float32.

Model-local functions are inlined first (their value types are unknown until
then). The module never imports torch; onnxruntime only in
:func:`emulation_session_options`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import InlinePass, ShapeInferencePass

BF16 = ir.DataType.BFLOAT16
F32 = ir.DataType.FLOAT

VALUE_PRESERVING = frozenset(
    {
        "Identity",
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Slice",
        "Gather",
        "GatherElements",
        "GatherND",
        "Concat",
        "Split",
        "Expand",
        "Tile",
        "Pad",
        "Where",
        "Max",
        "Min",
        "Neg",
        "Abs",
        "ReduceMax",
        "ReduceMin",
        "ScatterND",
        "ScatterElements",
        "Constant",
        "ConstantOfShape",
        "DepthToSpace",
        "SpaceToDepth",
    }
)
"""Standard-domain ops whose bf16 outputs are bf16 values whenever their inputs are."""

DTYPE_ATTRIBUTES = ("to", "dtype")
"""Integer attributes that name an element type (Cast, EyeLike, Random*, …)."""

SUFFIX = "__bf16emu"
"""Name suffix of the values and nodes the rewrite adds."""


def emulate_bf16(model: onnx.ModelProto | ir.Model) -> onnx.ModelProto | ir.Model:
    """A float32 graph that computes what ``model``'s bfloat16 graph computes (see module doc).

    Returns the same kind it was given: a new ``ModelProto`` for a proto, or the
    same ``ir.Model`` rewritten in place. A model without bfloat16 comes back
    unchanged in meaning. Initializers held as external data are widened lazily,
    when the result is saved or serialized.
    """
    if isinstance(model, onnx.ModelProto):
        rewritten = _rewrite(ir.serde.deserialize_model(model))
        return ir.serde.serialize_model(rewritten)
    if isinstance(model, ir.Model):
        return _rewrite(model)
    raise TypeError(f"emulate_bf16 takes an onnx.ModelProto or onnx_ir.Model, not {type(model)}")


def has_bf16(model: onnx.ModelProto | ir.Model) -> bool:
    """True when any value, initializer or dtype attribute of ``model`` is bfloat16."""
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    for graph in _graphs(model.graph):
        if any(v.dtype == BF16 for v in _values(graph)):
            return True
        for node in graph:
            if any(_names_bf16(a) for a in node.attributes.values()):
                return True
    return any(
        any(_names_bf16(a) for a in node.attributes.values())
        for fn in model.functions.values()
        for node in fn
    )


def emulation_session_options(threads: int = 1) -> Any:
    """onnxruntime SessionOptions for an emulated graph: fusions off, ``threads`` threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


# --------------------------------------------------------------------- rewrite


def _rewrite(model: ir.Model) -> ir.Model:
    if model.functions:
        InlinePass()(model)
    graphs = list(_graphs(model.graph))
    if any(n.outputs and any(v.type is None for v in n.outputs) for g in graphs for n in g):
        ShapeInferencePass()(model)
        graphs = list(_graphs(model.graph))
    _check_typed(graphs)
    for graph in graphs:
        _rewrite_graph(graph)
    return model


def _graphs(graph: ir.Graph) -> Iterable[ir.Graph]:
    """``graph`` and every subgraph (If / Loop / Scan bodies), outermost first."""
    yield graph
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield attr.as_graph()
            elif attr.type == ir.AttributeType.GRAPHS:
                yield from attr.as_graphs()


def _values(graph: ir.Graph) -> Iterable[ir.Value]:
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in graph:
        yield from node.outputs


def _check_typed(graphs: list[ir.Graph]) -> None:
    """Every node output must have a known type, or bf16-ness cannot be decided."""
    missing = [
        f"{node.op_type} {node.name!r} -> {value.name!r}"
        for graph in graphs
        for node in graph
        for value in node.outputs
        if value.type is None and value.name
    ]
    if missing:
        raise ValueError(
            "emulate_bf16 needs the element type of every value; these have none even after "
            f"onnx shape inference: {', '.join(missing[:10])}"
            + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else "")
        )


def _rewrite_graph(graph: ir.Graph) -> None:
    was_bf16 = {id(v) for v in _values(graph) if v.dtype == BF16}
    for value in graph.initializers.values():
        if value.dtype == BF16 and value.const_value is not None:
            value.const_value = _widened(value.const_value)
    for value in _values(graph):
        if id(value) in was_bf16:
            value.type = ir.TensorType(F32)
    for node in list(graph):
        _rewrite_attributes(node)
        bf16_outputs = [v for v in node.outputs if id(v) in was_bf16]
        if not bf16_outputs:
            continue
        if node.domain == "" and node.op_type == "Cast":
            _keep_single_rounding(graph, node, node.inputs[0], node.attributes)
        elif node.domain == "" and node.op_type == "CastLike":
            _keep_single_rounding(graph, node, node.inputs[0], {})
        elif node.domain == "" and node.op_type in VALUE_PRESERVING:
            continue
        else:
            for value in bf16_outputs:
                _round_after(graph, value, anchor=node)
    for value in list(graph.inputs):
        if id(value) in was_bf16:
            _round_after(graph, value, anchor=None)


def _rewrite_attributes(node: ir.Node) -> None:
    for name, attr in list(node.attributes.items()):
        if name in DTYPE_ATTRIBUTES and attr.type == ir.AttributeType.INT and attr.value == BF16:
            node.attributes[name] = ir.AttrInt64(name, F32)
        elif attr.type == ir.AttributeType.TENSOR and attr.value.dtype == BF16:
            node.attributes[name] = ir.AttrTensor(name, _widened(attr.value))
        elif attr.type == ir.AttributeType.TENSORS and any(t.dtype == BF16 for t in attr.value):
            widened = [_widened(t) if t.dtype == BF16 else t for t in attr.value]
            node.attributes[name] = ir.AttrTensors(name, widened)


def _names_bf16(attr: ir.Attr) -> bool:
    if attr.name in DTYPE_ATTRIBUTES and attr.type == ir.AttributeType.INT:
        return attr.value == BF16
    if attr.type == ir.AttributeType.TENSOR:
        return attr.value.dtype == BF16
    return False


def _widened(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    """``tensor`` (bfloat16) as float32, exact; external data is read only when needed."""

    def load() -> ir.TensorProtocol:
        data = np.asarray(tensor.numpy())
        if data.dtype != ml_dtypes.bfloat16:  # some readers hand back the raw uint16 bits
            data = data.view(ml_dtypes.bfloat16)
        return ir.tensor(data.astype(np.float32), name=tensor.name)

    if isinstance(tensor, ir.ExternalTensor | ir.LazyTensor):
        return ir.LazyTensor(load, dtype=F32, shape=tensor.shape, name=tensor.name)
    return load()


def _rounding_pair(name: str, source: ir.Value) -> tuple[ir.Node, ir.Node, ir.Value]:
    """``Cast(source, BFLOAT16)`` → ``Cast(FLOAT)``; returns both nodes and the f32 result."""
    to_bf16 = ir.node("Cast", [source], {"to": BF16}, name=f"{name}{SUFFIX}/to_bf16")
    to_bf16.outputs[0].name = f"{name}{SUFFIX}.bf16"
    to_bf16.outputs[0].type = ir.TensorType(BF16)
    to_bf16.outputs[0].shape = source.shape
    back = ir.node("Cast", [to_bf16.outputs[0]], {"to": F32}, name=f"{name}{SUFFIX}/to_f32")
    back.outputs[0].type = ir.TensorType(F32)
    back.outputs[0].shape = source.shape
    return to_bf16, back, back.outputs[0]


def _round_after(graph: ir.Graph, value: ir.Value, anchor: ir.Node | None) -> None:
    """Round ``value`` to bf16 for every consumer (and graph output) of it; keep its name."""
    name = value.name
    uses = list(value.uses())
    outputs = [i for i, out in enumerate(graph.outputs) if out is value]
    if not uses and not outputs:
        return
    is_input = value in graph.inputs
    if not is_input:
        value.name = f"{name}{SUFFIX}.unrounded"
    to_bf16, back, rounded = _rounding_pair(name, value)
    rounded.name = f"{name}{SUFFIX}.rounded" if is_input else name
    for user, index in uses:
        user.replace_input_with(index, rounded)
    for i in outputs:
        graph.outputs[i] = rounded
    if anchor is None:
        if len(graph):
            graph.insert_before(graph.node(0), [to_bf16, back])
        else:
            graph.extend([to_bf16, back])
    else:
        graph.insert_after(anchor, [to_bf16, back])


def _keep_single_rounding(
    graph: ir.Graph, node: ir.Node, source: ir.Value, attributes: Any
) -> None:
    """Replace a cast to bf16 by ``Cast(to=BFLOAT16)`` + ``Cast(to=FLOAT)`` (one rounding)."""
    out = node.outputs[0]
    name = out.name
    extra = {k: a.value for k, a in attributes.items() if k not in ("to",)}
    direct = ir.node("Cast", [source], {**extra, "to": BF16}, name=f"{name}{SUFFIX}/to_bf16")
    direct.outputs[0].name = f"{out.name}{SUFFIX}.bf16"
    direct.outputs[0].type = ir.TensorType(BF16)
    direct.outputs[0].shape = out.shape
    back = ir.node("Cast", [direct.outputs[0]], {"to": F32}, name=f"{name}{SUFFIX}/to_f32")
    graph.insert_after(node, [direct, back])
    widened = back.outputs[0]
    widened.type = ir.TensorType(F32)
    widened.shape = out.shape
    out.replace_all_uses_with(widened, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    widened.name = name
