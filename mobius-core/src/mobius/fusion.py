"""MatMulNBits nodes that read one input, fused into one node plus a ``Split``.

A decoder layer multiplies one normed hidden state by q, k and v (and the next one by
gate and up): three (two) ``MatMulNBits`` nodes on the same ``A``. After quantization
(:func:`mobius.quantization.quantize_component`) this pass concatenates their packed
blocks, scales and zero points along N, runs one ``MatMulNBits`` and splits its output
on the last axis. Nothing is re-quantized: every output column is computed from the same
blocks as before, so the result is the same; what goes is per-node work onnxruntime does
once per call whatever N is (at ``accuracy_level`` 4 the CPU kernel quantizes ``A`` to
int8 on every call, and each call partitions its work over the thread pool).

Measured on this repository's 2-core CPU (``benchmarks/graph_ab.py``, figures in
``benchmarks/README.md``): SmolLM2-135M Q4_1's decode step runs 895 nodes instead of 1105
(121 ``MatMulNBits`` instead of 211) in 0.87x the time; Gemma 3 270M's 0.96x.

A GGUF build's block-sum corrections (``ReduceSum(x by blocks) @ C`` added to the output,
:data:`mobius.quantization.CORRECTION`) fuse the same way: the members share the block
sums of ``A`` already, their ``C`` matrices are concatenated along N and one ``MatMul`` +
``Add`` serves the group.

Nodes fuse only when they agree on everything but N: ``K``, ``bits``, ``block_size``,
``accuracy_level``, the zero points' kind (none, uint8, float), the correction (none, or
one over the same block sums) and the output type; and when their weight initializers
are read by no other node (a tied head's blocks, shared with a ``GatherBlockQuantized``,
stay as they are). Members of one GGUF layer stored in different types (Q4_K q and k,
Q6_K v) therefore fuse as far as their forms agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius.weights import WeightPlan, concat

MS_DOMAIN = "com.microsoft"


@dataclass
class _Member:
    """One fusable ``MatMulNBits`` (with its correction ``MatMul`` + ``Add``, if any)."""

    node: ir.Node
    n: int
    blocks: ir.Value
    scales: ir.Value
    zero_points: ir.Value | None
    fix: ir.Node | None  # MatMul(block sums, C)
    add: ir.Node | None  # Add(node output, fix output)
    correction: ir.Value | None  # C, [n_blocks, n]

    @property
    def out(self) -> ir.Value:
        return (self.add or self.node).outputs[0]

    @property
    def nodes(self) -> list[ir.Node]:
        return [n for n in (self.add, self.fix, self.node) if n is not None]

    @property
    def weights(self) -> list[ir.Value]:
        values = [self.blocks, self.scales, self.zero_points, self.correction]
        return [v for v in values if v is not None]


def _attr(node: ir.Node, name: str) -> Any:
    attr = node.attributes.get(name)
    return None if attr is None else attr.value


def _planned(graph: ir.Graph, value: ir.Value | None, entries: dict[str, Any]) -> bool:
    """``value`` is a data-less initializer of the plan read by exactly one node once."""
    return (
        value is not None
        and graph.initializers.get(value.name or "") is value
        and value.const_value is None
        and value.name in entries
        and len(value.uses()) == 1
        and not value.is_graph_output()
    )


def _member(graph: ir.Graph, node: ir.Node, entries: dict[str, Any]) -> tuple[Any, _Member] | None:
    """``(group key, member)`` for a fusable ``MatMulNBits``, else None."""
    if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN:
        return None
    inputs = list(node.inputs)
    if not 3 <= len(inputs) <= 4 or inputs[0] is None:  # no g_idx, no bias
        return None
    a, blocks, scales = inputs[:3]
    zp = inputs[3] if len(inputs) == 4 else None
    if len(inputs) == 4 and zp is None:
        return None
    if not all(_planned(graph, v, entries) for v in (blocks, scales, *([zp] if zp else []))):
        return None
    out = node.outputs[0]
    if out.type is None:
        return None
    fix = add = correction = None
    sums = None
    uses = out.uses()
    if len(uses) == 1 and uses[0].node.op_type == "Add" and uses[0].node.domain in ("", "ai.onnx"):
        cand = uses[0].node
        other = cand.inputs[1 - uses[0].idx]
        producer = other.producer() if other is not None else None
        if (
            producer is not None
            and producer.op_type == "MatMul"
            and producer.domain in ("", "ai.onnx")
            and len(other.uses()) == 1
            and _planned(graph, producer.inputs[1], entries)
            and producer.inputs[0] is not None
        ):
            c = producer.inputs[1]
            base = (blocks.name or "").removesuffix(".quant")
            # the block-sum correction quantize_component wrote for this weight, nothing else
            if c.name == f"{base}.correction" and c.shape is not None and len(c.shape) == 2:
                fix, add, correction, sums = producer, cand, c, producer.inputs[0]
    zp_kind = None if zp is None else zp.dtype
    key = (
        id(a),
        _attr(node, "K"),
        _attr(node, "bits"),
        _attr(node, "block_size"),
        _attr(node, "accuracy_level"),
        zp_kind,
        None if sums is None else id(sums),
        out.dtype,
    )
    n = _attr(node, "N")
    if not isinstance(n, int) or None in key[1:5]:
        return None
    return key, _Member(node, n, blocks, scales, zp, fix, add, correction)


def _init(graph: ir.Graph, name: str, like: ir.Value, shape: Sequence[int]) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(list(shape)), type=like.type)
    graph.initializers.add(value)
    return value


def _fused_name(names: Sequence[str]) -> str:
    """``layers.0.self_attn.{q_proj,k_proj,v_proj}.weight`` style: the members' common
    head and tail around their differing middles."""
    head = ""
    for chars in zip(*names):
        if len(set(chars)) > 1:
            break
        head += chars[0]
    head = head[: head.rfind(".") + 1]
    rest = [n[len(head) :] for n in names]
    tail = ""
    for chars in zip(*(r[::-1] for r in rest)):
        if len(set(chars)) > 1:
            break
        tail = chars[0] + tail
    tail = tail[tail.find(".") :] if "." in tail else ""
    middles = [r[: len(r) - len(tail)] for r in rest]
    return f"{head}{{{','.join(middles)}}}{tail}"


def fuse_shared_input_nbits(
    model: ir.Model, plan: WeightPlan
) -> tuple[WeightPlan, dict[str, list[str]]]:
    """Fuse the ``MatMulNBits`` nodes of ``model`` that read one input (see the module
    docstring), in place; return the plan with the fused initializers' expressions and,
    per fused group, its name (the prefix of its initializers) and the names of the
    packed-block initializers it replaced, in output order."""
    graph = model.graph
    entries = dict(plan.entries)
    groups: dict[Any, list[_Member]] = {}
    for node in list(graph):
        found = _member(graph, node, entries)
        if found is not None:
            groups.setdefault(found[0], []).append(found[1])
    fused: dict[str, list[str]] = {}
    for members in groups.values():
        if len(members) > 1:
            names = [m.blocks.name or "" for m in members]
            fused[_fuse(graph, members, entries)] = names
    if not fused:
        return plan, fused
    out = WeightPlan()
    for name, expr in entries.items():
        out.add(name, expr)
    for tensor, why in plan.ignored.items():
        out.ignore(tensor, why)
    return out, fused


def _fuse(graph: ir.Graph, members: list[_Member], entries: dict[str, Any]) -> str:
    """Replace ``members`` (in graph order) by one fused chain; return its name."""
    first = members[0]
    node = first.node
    total = sum(m.n for m in members)
    base = _fused_name([(m.blocks.name or "").removesuffix(".quant") for m in members])
    blocks_shape = list(first.blocks.shape)
    blocks = _init(graph, f"{base}.quant", first.blocks, [total, *blocks_shape[1:]])
    scales = _init(graph, f"{base}.scales", first.scales, [total, *list(first.scales.shape)[1:]])
    made: list[tuple[ir.Value, Any]] = [
        (blocks, concat([entries[m.blocks.name] for m in members], axis=0)),
        (scales, concat([entries[m.scales.name] for m in members], axis=0)),
    ]
    inputs = [node.inputs[0], blocks, scales]
    if first.zero_points is not None:
        zp_shape = list(first.zero_points.shape)
        zp = _init(graph, f"{base}.zero_points", first.zero_points, [total, *zp_shape[1:]])
        made.append((zp, concat([entries[m.zero_points.name] for m in members], axis=0)))
        inputs.append(zp)
    attrs = {k: _attr(node, k) for k in ("K", "bits", "block_size", "accuracy_level")}
    mm = ir.node("MatMulNBits", inputs, {**attrs, "N": total}, domain=MS_DOMAIN,
                 name=f"{base}.nbits")  # fmt: skip
    new_nodes = [mm]
    lead = list(first.out.shape)[:-1] if first.out.shape is not None else None

    def typed(value: ir.Value, n: int) -> None:
        value.type = first.out.type
        value.shape = ir.Shape([*lead, n]) if lead is not None else None

    typed(mm.outputs[0], total)
    mm.outputs[0].name = f"{base}.y.levels" if first.fix is not None else f"{base}.y"
    last = mm.outputs[0]
    if first.fix is not None:
        assert first.correction is not None
        c_shape = list(first.correction.shape)
        c = _init(graph, f"{base}.correction", first.correction, [c_shape[0], total])
        made.append((c, concat([entries[m.correction.name] for m in members], axis=1)))
        fix = ir.node("MatMul", [first.fix.inputs[0], c], name=f"{base}.correction")
        add = ir.node("Add", [last, fix.outputs[0]], name=f"{base}.corrected")
        for value, tail in ((fix.outputs[0], ".correction"), (add.outputs[0], "")):
            typed(value, total)
            value.name = f"{base}.y{tail}"
        new_nodes += [fix, add]
        last = add.outputs[0]
    sizes = ir.Value(name=f"{base}.split", shape=ir.Shape([len(members)]),
                     type=ir.TensorType(ir.DataType.INT64))  # fmt: skip
    sizes.const_value = ir.tensor(np.array([m.n for m in members], np.int64), name=sizes.name)
    graph.register_initializer(sizes)
    split = ir.node("Split", [last, sizes], {"axis": -1}, num_outputs=len(members),
                    name=f"{base}.split")  # fmt: skip
    new_nodes.append(split)
    # before the first member output's producer: after every input of the group (the
    # block sums too), before every consumer of any member
    order = {id(n): i for i, n in enumerate(graph)}
    anchor = min((m.add or m.node for m in members), key=lambda n: order[id(n)])
    graph.insert_before(anchor, new_nodes)
    for member, piece in zip(members, split.outputs):
        old = member.out
        name = old.name
        typed(piece, member.n)
        old.replace_all_uses_with(piece, replace_graph_outputs=True)
        graph.remove(member.nodes, safe=True)
        for value in member.weights:
            graph.initializers.pop(value.name)
            del entries[value.name]
        piece.name = name
    for value, expr in made:
        entries[value.name] = expr
    return base
