"""Weight-only quantization of built components (``mobius build --quant int4|int8``).

Runs in the build after a family has built (and every plugin optimized) a component
and made its weight plan, before the weights are bound (``docs/quantization.md``):

- ``MatMul(A, B)`` and ``Gemm(A, B)`` (``transA`` 0, ``alpha`` 1, no ``C``) whose ``B``
  is a planned 2-D float initializer become com.microsoft ``MatMulNBits``;
- ``Gather(table, ids)`` on axis 0 of a planned 2-D float initializer whose row length
  is a multiple of the block size becomes com.microsoft ``GatherBlockQuantized`` (3-D
  data ``[V, n_blocks, blob]``, ``quantize_axis`` 2) and a Reshape back to ``[..., H]``;
- a table read by both (a tied embedding / lm_head: ``Gather`` and ``Gemm`` with
  ``transB``) is quantized once; both ops read the same packed initializer.

The plan entry of each rewritten initializer is replaced by the lazy quantize step of
:mod:`mobius.weights.quantize`, so nothing is read here and every tensor is quantized
while the package writer streams it. Which tensors stay float: ``QuantOptions.exclude``
globs (the user's), then the owning family's ``mobius_quant_overrides`` answer (globs
→ ``float`` / ``int4`` / ``int8``), first match wins within each.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from mobius.errors import BuildError
from mobius.records import BuildOptions, QuantOptions
from mobius.weights import WeightPlan
from mobius.weights.dtypes import FLOATS, NAME_OF_IR
from mobius.weights.quantize import (
    QuantizedExprs,
    QuantScheme,
    n_blocks,
    quantized,
    rows_of_matmul_weight,
    source_tensors,
    zero_point_cols,
)

MS_DOMAIN = "com.microsoft"
OVERRIDE_VALUES = ("float", "int4", "int8")
"""What a ``mobius_quant_overrides`` glob may map to."""
_BITS = {"int4": 4, "int8": 8}


@dataclass
class ComponentQuant:
    """What :func:`quantize_component` did to one component."""

    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    """initializer name → {"ops": [...], "bits": b, "shape": [R, K]}."""
    kept_float: dict[str, str] = field(default_factory=dict)
    """float 2-D initializers of MatMul / Gemm / Gather left float → why."""
    matched_excludes: set[str] = field(default_factory=set)
    """user exclude globs that matched at least one candidate tensor."""
    initializers: set[str] = field(default_factory=set)
    """names of the initializers the quantize step makes (packed, scales, zero points)."""


@dataclass
class _Use:
    node: ir.Node
    kind: str  # "matmul" (B is [K, N]), "matmul_t" (B is [N, K]), "gather"


def _attr(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _quantizable_use(node: ir.Node, value: ir.Value) -> str | None:
    """How ``node`` reads initializer ``value`` if a quantized op can replace it."""
    if node.domain not in ("", "ai.onnx"):
        return None
    inputs = list(node.inputs)
    if node.op_type == "MatMul" and len(inputs) == 2 and inputs[1] is value:
        return "matmul" if inputs[0] is not value else None
    if node.op_type == "Gemm" and len(inputs) == 2 and inputs[1] is value:
        ok = _attr(node, "transA", 0) == 0 and _attr(node, "alpha", 1.0) == 1.0
        if ok and inputs[0] is not value:
            return "matmul_t" if _attr(node, "transB", 0) else "matmul"
    if node.op_type == "Gather" and len(inputs) == 2 and inputs[0] is value:
        return "gather" if _attr(node, "axis", 0) == 0 else None
    return None


def _choice(
    name: str, default: str, excludes: Sequence[str], overrides: Mapping[str, str], report: Any
) -> tuple[str, str]:
    """(``float`` / ``int4`` / ``int8``, why) for initializer ``name``."""
    for glob in excludes:
        if fnmatch.fnmatchcase(name, glob):
            report.matched_excludes.add(glob)
            return "float", f"--quant-exclude {glob}"
    for glob, value in overrides.items():
        if fnmatch.fnmatchcase(name, glob):
            return value, f"family override {glob!r}"
    return default, ""


def check_overrides(answer: Any, where: str) -> dict[str, str]:
    """Validate a ``mobius_quant_overrides`` answer: every problem listed in one error."""
    if answer is None:
        return {}
    if not isinstance(answer, Mapping):
        raise BuildError(
            f"mobius_quant_overrides returned {type(answer).__name__}, not a mapping",
            where=where,
            fix="return {glob: 'float' | 'int4' | 'int8'}",
        )
    problems = [
        f"{glob!r} → {value!r}"
        for glob, value in answer.items()
        if not isinstance(glob, str) or value not in OVERRIDE_VALUES
    ]
    if problems:
        raise BuildError(
            f"mobius_quant_overrides answer has invalid entries: {', '.join(problems)}",
            where=where,
            fix=f"map string globs to one of {', '.join(OVERRIDE_VALUES)}",
        )
    return dict(answer)


KeepScheme = Callable[[Any, bool], "QuantScheme | str"]
"""How a build that keeps a checkpoint's own quantization (a GGUF file) stores one
initializer: called with the plan expression of its ``[R, K]`` rows (a checkpoint
tensor, or rows concatenated from several) and whether a Gather reads it; answers the
scheme, or why it stays float."""


def quantize_component(
    model: ir.Model,
    plan: WeightPlan,
    quant: QuantOptions | None,
    *,
    target: str = "default",
    overrides: Mapping[str, str] | None = None,
    search: bool = True,
    keep: KeepScheme | None = None,
) -> tuple[WeightPlan, ComponentQuant]:
    """Rewrite ``model`` in place to quantized ops and return the matching plan.

    Only initializers the plan computes (no data yet) are candidates; an initializer
    also read by any other op, or by ops wanting different orientations, stays float.
    ``search`` False gives plain round-to-nearest scales (onnxruntime's). ``quant`` None
    with ``keep``: every tensor takes the scheme ``keep`` answers (the checkpoint's own
    blocks), none is requantized to one scheme.
    """
    if quant is None and keep is None:
        raise ValueError("quantize_component needs quant options or a keep function")
    options = quant or QuantOptions()
    accuracy_level, excludes = options.level_for(target), options.exclude
    graph = model.graph
    overrides = overrides or {}
    report = ComponentQuant()
    entries = dict(plan.entries)
    consumers: dict[str, list[_Use]] = {}
    blocked: dict[str, str] = {}
    for node in graph:
        for value in node.inputs:
            if value is None or value.name not in entries:
                continue
            if graph.initializers.get(value.name) is not value or value.const_value is not None:
                continue
            kind = _quantizable_use(node, value)
            if kind is None:
                blocked.setdefault(value.name, f"also read by {node.op_type}")
            else:
                consumers.setdefault(value.name, []).append(_Use(node, kind))

    new_entries: dict[str, Any] = {}
    block_sums: dict[tuple[int, int], ir.Value] = {}
    for name, uses in consumers.items():
        value = graph.initializers[name]
        dtype = NAME_OF_IR.get(value.dtype) if value.dtype is not None else None
        shape = tuple(value.shape) if value.shape is not None else ()
        kinds = {u.kind for u in uses}
        why = blocked.get(name)
        seen = {id(u.node) for u in uses}
        if why is None and any(id(use.node) not in seen for use in value.uses()):
            why = "also read inside a subgraph"
        if why is None and value.is_graph_output():
            why = "a graph output"
        experts = len(shape) == 3 and kinds == {"gather"}
        if why is None and (
            dtype not in FLOATS or dtype == "float64" or not (len(shape) == 2 or experts)
        ):
            why = "not a 2-D float32/16 initializer (or a 3-D expert table)"
        if why is None and not all(isinstance(d, int) for d in shape):
            why = "no static shape"
        if why is None and "matmul" in kinds and kinds & {"matmul_t", "gather"}:
            why = "read in two orientations"
        scheme: QuantScheme | None = None
        source: str | None = None
        if why is None and quant is not None:
            choice, reason = _choice(name, options.method, excludes, overrides, report)
            if choice == "float":
                why = reason
            else:
                scheme = QuantScheme(
                    bits=_BITS[choice],
                    block_size=options.block_size,
                    symmetric=options.symmetric,
                    search=search,
                )
        elif why is None and keep is not None:
            rows = entries[name]
            if experts:
                e, k, n = shape
                rows = rows_of_matmul_weight(rows, experts=True).reshape([e * n, k])
            elif kinds == {"matmul"}:
                rows = rows_of_matmul_weight(rows)
            names = source_tensors(rows)
            source = names[0] if len(names) == 1 else ", ".join(names)
            got = keep(rows, "gather" in kinds)
            why, scheme = (got, None) if isinstance(got, str) else (None, got)
        k_axis = 1 if experts else -1
        gathered = scheme is not None and "gather" in kinds
        if why is None and gathered and shape[k_axis] % scheme.block_size:
            why = (
                f"row length {shape[k_axis]} is not a multiple of the block size "
                f"{scheme.block_size}"
            )
        if why is not None or scheme is None:
            report.kept_float[name] = why or "no scheme"
            continue
        bits, block_size = scheme.bits, scheme.block_size
        rows_expr = entries[name]
        if experts:
            e, k, n = shape
            rows = rows_of_matmul_weight(rows_expr, experts=True).reshape([e * n, k])
            _rewrite_experts(
                graph, name, uses, shape=(e, k, n), bits=bits, block_size=block_size,
                float_type=value.dtype, new_entries=new_entries, exprs=quantized(rows, scheme),
            )  # fmt: skip
            del entries[name]
            graph.initializers.pop(name)
            report.tensors[name] = {"ops": ["GatherBlockQuantized"], "bits": bits,
                                    "shape": [e, n, k]}  # fmt: skip
            if keep is not None and quant is None:
                report.tensors[name].update(
                    block_size=block_size, zero_points=_zero_point_kind(scheme), source=source
                )
            continue
        if kinds == {"matmul"}:
            rows_expr = rows_of_matmul_weight(rows_expr)
            n, k = shape[1], shape[0]
        else:
            n, k = shape
        exprs = quantized(rows_expr, scheme)
        _rewrite(
            graph, name, uses, n=n, k=k, scheme=scheme, accuracy_level=accuracy_level,
            float_type=value.dtype, new_entries=new_entries, exprs=exprs, block_sums=block_sums,
        )  # fmt: skip
        del entries[name]
        graph.initializers.pop(name)
        report.tensors[name] = {
            "ops": sorted({_OP_OF_KIND[u.kind] for u in uses}),
            "bits": bits,
            "shape": [n, k],
        }
        if keep is not None and quant is None:
            report.tensors[name].update(
                block_size=block_size, zero_points=_zero_point_kind(scheme), source=source
            )
            if scheme.block_correction:
                report.tensors[name]["correction"] = CORRECTION
    report.initializers = set(new_entries)
    if report.tensors:
        model.opset_imports.setdefault(MS_DOMAIN, 1)
    out = WeightPlan()
    for name, expr in {**entries, **new_entries}.items():
        out.add(name, expr)
    for tensor, why in plan.ignored.items():
        out.ignore(tensor, why)
    if target in FUSING_TARGETS and report.tensors:
        out = _fused(model, out, report)
    return out, report


FUSING_TARGETS = ("cpu",)
"""Targets whose builds fuse the ``MatMulNBits`` nodes reading one input
(:mod:`mobius.fusion`): measured faster on onnxruntime's CPU kernels."""


def _fused(model: ir.Model, plan: WeightPlan, report: ComponentQuant) -> WeightPlan:
    """:func:`mobius.fusion.fuse_shared_input_nbits`, with ``report`` kept true: its
    initializer names, and ``fused`` (the group's name) on each fused tensor."""
    from mobius.fusion import fuse_shared_input_nbits

    before = set(plan.entries)
    out, groups = fuse_shared_input_nbits(model, plan)
    after = set(out.entries)
    report.initializers = (report.initializers & after) | (after - before)
    by_blocks = {f"{name}.quant": name for name in report.tensors}
    for group, blocks in groups.items():
        for name in blocks:
            report.tensors[by_blocks[name]]["fused"] = group
    return out


CORRECTION = "block-sums"
"""The manifest's ``correction`` of a tensor kept with ``QuantScheme.block_correction``:
the MatMulNBits output plus ``ReduceSum(x by blocks) @ C``."""


def _zero_point_kind(scheme: QuantScheme) -> str:
    """``none`` (symmetric), ``uint8`` or ``float`` (the manifest's words)."""
    if scheme.float_zero_points:
        return "float"
    return "none" if scheme.symmetric else "uint8"


_OP_OF_KIND = {"matmul": "MatMulNBits", "matmul_t": "MatMulNBits", "gather": "GatherBlockQuantized"}


def _new_init(graph: ir.Graph, name: str, shape: Sequence[int], dtype: ir.DataType) -> ir.Value:
    """A data-less initializer (its data comes from the weight plan at bind time)."""
    if name in graph.initializers:
        raise BuildError(
            f"cannot quantize: the graph already has an initializer named {name!r}",
            where=f"graph {graph.name!r}",
            fix="rename that initializer in the family plugin, or --quant-exclude its source",
        )
    value = ir.Value(name=name, shape=ir.Shape(list(shape)), type=ir.TensorType(dtype))
    graph.initializers.add(value)  # register_initializer() insists on data
    return value


def _constant(graph: ir.Graph, name: str, array: Any) -> ir.Value:
    """An int64 initializer carrying ``array`` (a shape for a Reshape)."""
    int64 = ir.TensorType(ir.DataType.INT64)
    value = ir.Value(name=name, shape=ir.Shape(list(array.shape)), type=int64)
    value.const_value = ir.tensor(array, name=name)
    graph.register_initializer(value)
    return value


def _rewrite(
    graph: ir.Graph,
    name: str,
    uses: Sequence[_Use],
    *,
    n: int,
    k: int,
    scheme: QuantScheme,
    accuracy_level: int,
    float_type: ir.DataType,
    new_entries: dict[str, Any],
    exprs: QuantizedExprs,
    block_sums: dict[tuple[int, int], ir.Value] | None = None,
) -> None:
    """Replace every use of initializer ``name`` by its quantized op (float zero points:
    ``[N, n_blocks]`` in the float type, MatMulNBits only; a block correction: the
    MatMulNBits output plus ``ReduceSum(x by blocks) @ C``, the block sums made once
    per input value and block size, kept in ``block_sums``)."""
    import numpy as np

    bits, block_size = scheme.bits, scheme.block_size
    nb = n_blocks(k, block_size)
    blob = block_size * bits // 8
    gathers = any(u.kind == "gather" for u in uses)
    packed = _new_init(graph, f"{name}.quant", (n, nb, blob), ir.DataType.UINT8)
    new_entries[packed.name] = exprs.packed
    # GatherBlockQuantized wants scales of data's rank; MatMulNBits takes [N, n_blocks].
    scale_shape = (n, nb, 1) if gathers else (n, nb)
    scales = _new_init(graph, f"{name}.scales", scale_shape, float_type)
    new_entries[scales.name] = exprs.scales.reshape(scale_shape) if gathers else exprs.scales
    zp = gather_zp = correction = None
    if (scheme.float_zero_points or scheme.block_correction) and gathers:
        raise BuildError(
            f"cannot give {name!r} float zero points or block corrections: a Gather reads it",
            where=f"graph {graph.name!r}",
            fix="this is a bug in the scheme choice; report it",
        )
    if scheme.block_correction:
        assert exprs.correction is not None
        correction = _new_init(graph, f"{name}.correction", (nb, n), float_type)
        new_entries[correction.name] = exprs.correction
        if block_sums is None:
            block_sums = {}
    if scheme.float_zero_points:
        zp = _new_init(graph, f"{name}.zero_points", (n, nb), float_type)
        new_entries[zp.name] = exprs.zero_points
    elif not scheme.symmetric:
        zp_cols = zero_point_cols(nb, bits)
        if any(u.kind != "gather" for u in uses):
            zp = _new_init(graph, f"{name}.zero_points", (n, zp_cols), ir.DataType.UINT8)
            new_entries[zp.name] = exprs.zero_points
        if gathers:  # one zero point per byte, rank 3: [V, n_blocks, 1]
            gather_zp = _new_init(
                graph, f"{name}.gather_zero_points", (n, nb, 1), ir.DataType.UINT8
            )
            new_entries[gather_zp.name] = exprs.gather_zero_points
    mm_scales = scales
    if gathers and any(u.kind != "gather" for u in uses):
        shape = _constant(graph, f"{name}.scales_shape", np.array([n, nb], np.int64))
        node = ir.node("Reshape", [scales, shape], name=f"{name}.scales_2d")
        _insert_first(graph, node)
        mm_scales = node.outputs[0]
        mm_scales.name = f"{name}.scales_2d"
    for use in uses:
        old = use.node
        if use.kind == "gather":
            ids = old.inputs[1]
            gbq_inputs = [packed, ids, scales] + ([gather_zp] if gather_zp is not None else [])
            gbq = ir.node(
                "GatherBlockQuantized",
                gbq_inputs,
                {"bits": bits, "block_size": block_size, "gather_axis": 0, "quantize_axis": 2},
                domain=MS_DOMAIN,
                name=f"{old.name or name}.gbq",
            )
            gbq.outputs[0].name = f"{old.outputs[0].name}.blocks"
            ids_shape = ir.node("Shape", [ids], name=f"{old.name or name}.ids_shape")
            hidden = _constant(graph, f"{old.name or name}.row_len", np.array([k], np.int64))
            out_shape = ir.node("Concat", [ids_shape.outputs[0], hidden], {"axis": 0})
            reshape = ir.node("Reshape", [gbq.outputs[0], out_shape.outputs[0]])
            new_nodes = [gbq, ids_shape, out_shape, reshape]
            for i, node in enumerate(new_nodes[1:], 1):
                node.name = f"{old.name or name}.gbq_{i}"
                node.outputs[0].name = f"{old.outputs[0].name}.gbq_{i}"
        else:
            inputs = [old.inputs[0], packed, mm_scales] + ([zp] if zp is not None else [])
            mm = ir.node(
                "MatMulNBits",
                inputs,
                {
                    "K": k,
                    "N": n,
                    "bits": bits,
                    "block_size": block_size,
                    "accuracy_level": accuracy_level,
                },
                domain=MS_DOMAIN,
                name=f"{old.name or name}.nbits",
            )
            new_nodes = [mm]
            if correction is not None:
                assert block_sums is not None
                sums = _block_sums(graph, old.inputs[0], k, block_size, block_sums)
                base = old.name or name
                fix = ir.node("MatMul", [sums, correction], name=f"{base}.correction")
                add = ir.node("Add", [mm.outputs[0], fix.outputs[0]], name=f"{base}.corrected")
                for node, tail in ((mm, "levels"), (fix, "correction")):
                    node.outputs[0].name = f"{old.outputs[0].name}.{tail}"
                    node.outputs[0].type = old.outputs[0].type
                new_nodes += [fix, add]
        last = new_nodes[-1].outputs[0]
        out_value = old.outputs[0]
        last.shape, last.type = out_value.shape, out_value.type
        ir.convenience.replace_nodes_and_values(graph, old, [old], new_nodes, [out_value], [last])


def _block_sums(
    graph: ir.Graph,
    x: ir.Value,
    k: int,
    block_size: int,
    cache: dict[tuple[int, int], ir.Value],
) -> ir.Value:
    """``[..., n_blocks]``: the sums of ``x``'s last axis (``k`` values, a multiple of
    ``block_size``) by blocks of ``block_size``, made once per value and block size, right
    after ``x``'s producer (or first in the graph for an input)."""
    import numpy as np

    key = (id(x), block_size)
    if key in cache:
        return cache[key]
    if k % block_size:
        raise BuildError(
            f"cannot correct blocks of {block_size}: the row length {k} is not a multiple",
            where=f"graph {graph.name!r}",
            fix="this is a bug in the scheme choice; report it",
        )
    nb = k // block_size
    base = f"{x.name or f'input{len(cache)}'}.block_sums{block_size}"
    nodes: list[ir.Node] = []
    rank = len(x.shape) if x.shape is not None else None
    if rank is not None and rank >= 1:
        dims = np.array([0] * (rank - 1) + [nb, block_size], np.int64)
        shape = _constant(graph, f"{base}_shape", dims)
    else:  # unknown rank: Shape(x)[:-1] ++ [nb, block_size]
        start = _constant(graph, f"{base}_start", np.array([0], np.int64))
        end = _constant(graph, f"{base}_end", np.array([-1], np.int64))
        tail = _constant(graph, f"{base}_tail", np.array([nb, block_size], np.int64))
        nodes.append(ir.node("Shape", [x], name=f"{base}_dims"))
        nodes.append(ir.node("Slice", [nodes[-1].outputs[0], start, end], name=f"{base}_lead"))
        nodes.append(ir.node("Concat", [nodes[-1].outputs[0], tail], {"axis": 0}))
        shape = nodes[-1].outputs[0]
    nodes.append(ir.node("Reshape", [x, shape], name=f"{base}_blocks"))
    last_axis = _constant(graph, f"{base}_axis", np.array([-1], np.int64))
    nodes.append(
        ir.node("ReduceSum", [nodes[-1].outputs[0], last_axis], {"keepdims": 0}, name=base)
    )
    for i, node in enumerate(nodes):
        node.name = node.name or f"{base}_{i}"
        node.outputs[0].name = node.name
    out = nodes[-1].outputs[0]
    out.name = base
    out.type = x.type
    producer = x.producer()
    if producer is not None and producer.graph is graph:
        graph.insert_after(producer, nodes)
    else:
        first = next(iter(graph), None)
        if first is None:
            graph.extend(nodes)
        else:
            graph.insert_before(first, nodes)
    cache[key] = out
    return out


def _rewrite_experts(
    graph: ir.Graph,
    name: str,
    uses: Sequence[_Use],
    *,
    shape: tuple[int, int, int],
    bits: int,
    block_size: int,
    float_type: ir.DataType,
    new_entries: dict[str, Any],
    exprs: QuantizedExprs,
) -> None:
    """An expert table ``[E, K, N]`` read by ``Gather(table, experts, axis=0)`` (the
    routed experts of :mod:`mobius.components.experts`) becomes GatherBlockQuantized of
    the per-expert ``MatMulNBits`` packing ``[E, N, n_blocks, blob]`` (blocks along
    ``K``), reshaped to ``[U, N, K]`` and transposed back to ``[U, K, N]``: a step reads
    the hit experts' int4 / int8 bytes only and the MatMuls after it are unchanged."""
    import numpy as np

    e, k, n = shape
    nb = n_blocks(k, block_size)
    packed = _new_init(
        graph, f"{name}.quant", (e, n, nb, block_size * bits // 8), ir.DataType.UINT8
    )
    new_entries[packed.name] = exprs.packed.reshape([e, n, nb, block_size * bits // 8])
    scales = _new_init(graph, f"{name}.scales", (e, n, nb, 1), float_type)
    new_entries[scales.name] = exprs.scales.reshape([e, n, nb, 1])
    inputs: list[ir.Value | None] = [packed, None, scales]
    if exprs.gather_zero_points is not None:
        zp = _new_init(graph, f"{name}.gather_zero_points", (e, n, nb, 1), ir.DataType.UINT8)
        new_entries[zp.name] = exprs.gather_zero_points.reshape([e, n, nb, 1])
        inputs.append(zp)
    row_shape = _constant(graph, f"{name}.expert_shape", np.array([0, n, k], np.int64))
    for use in uses:
        old = use.node
        base = old.name or name
        inputs[1] = old.inputs[1]
        gbq = ir.node(
            "GatherBlockQuantized",
            list(inputs),
            {"bits": bits, "block_size": block_size, "gather_axis": 0, "quantize_axis": 3},
            domain=MS_DOMAIN,
            name=f"{base}.gbq",
        )
        reshape = ir.node("Reshape", [gbq.outputs[0], row_shape], name=f"{base}.gbq_rows")
        back = ir.node("Transpose", [reshape.outputs[0]], {"perm": [0, 2, 1]}, name=f"{base}.gbq_t")
        for node in (gbq, reshape, back):
            node.outputs[0].name = f"{node.name}.out"
        out_value = old.outputs[0]
        last = back.outputs[0]
        last.shape, last.type = out_value.shape, out_value.type
        ir.convenience.replace_nodes_and_values(
            graph, old, [old], [gbq, reshape, back], [out_value], [last]
        )


def _insert_first(graph: ir.Graph, node: ir.Node) -> None:
    first = next(iter(graph), None)
    if first is None:
        graph.append(node)
    else:
        graph.insert_before(first, node)


def initializer_bytes(model: ir.Model, quantized: set[str]) -> tuple[int, int]:
    """(bytes of the ``quantized`` initializers, bytes of all others), from shapes."""
    quant = other = 0
    for name, value in model.graph.initializers.items():
        if value.dtype is None or value.shape is None:
            continue
        dims = [d for d in value.shape if isinstance(d, int)]
        size = math.ceil(math.prod(dims) * value.dtype.itemsize)
        if name in quantized:
            quant += size
        else:
            other += size
    return quant, other


def unmatched_excludes(quant: QuantOptions, reports: Iterable[ComponentQuant]) -> list[str]:
    """The user's exclude globs that matched no candidate tensor in any component."""
    matched: set[str] = set()
    for report in reports:
        matched |= report.matched_excludes
    return [glob for glob in quant.exclude if glob not in matched]


SCALE_METHOD = "rtn+mse-scale-search"
"""The manifest's ``quantization.method``: round to nearest with a per-block scale search."""

RTN_METHOD = "rtn"
"""The manifest's ``quantization.method`` of a ``--no-scale-search`` build."""


def manifest_entry(
    options: BuildOptions, reports: Mapping[str, ComponentQuant], graphs: Mapping[str, ir.Model]
) -> dict[str, Any]:
    """The manifest's ``"quantization"`` object (``docs/quantization.md``)."""
    quant = options.quant
    assert quant is not None
    components: dict[str, Any] = {}
    for name, report in reports.items():
        q_bytes, f_bytes = initializer_bytes(graphs[name], report.initializers)
        components[name] = {
            "tensors": dict(sorted(report.tensors.items())),
            "kept_float": dict(sorted(report.kept_float.items())),
            "quantized_bytes": q_bytes,
            "other_bytes": f_bytes,
        }
    return {
        "method": SCALE_METHOD if quant.search else RTN_METHOD,
        "format": quant.method,
        "bits": quant.bits,
        "block_size": quant.block_size,
        "symmetric": quant.symmetric,
        "accuracy_level": quant.level_for(options.target),
        "activation_dtype": options.port_dtype,
        "exclude": list(quant.exclude),
        "components": components,
    }


KEPT_METHOD = "kept-from-source"
"""The manifest's ``quantization.method`` of a build that keeps a GGUF file's blocks."""


class SourceQuant:
    """A build that keeps the checkpoint's own quantization (a GGUF file built without
    ``--quant`` or ``--dtype``): the :data:`KeepScheme` of :func:`quantize_component`,
    asking the checkpoint's ``kept_scheme`` for every tensor, then the manifest entry
    and the lines the build prints (tensors dequantized and why, the largest weight
    error of each format ``--target cpu`` approximated)."""

    def __init__(self, checkpoint: Any, target: str) -> None:
        from mobius.weights.quantize import WeightErrors

        self.checkpoint = checkpoint
        self.target = target
        self.errors = WeightErrors()

    def __call__(self, rows: Any, gather: bool) -> QuantScheme | str:
        """The scheme of the tensor(s) the rows expression ``rows`` is made of: one
        checkpoint tensor, or several whose rows it only moves (an expert table
        concatenated from GGUF's gate and up tables), all kept in one scheme."""
        from mobius.weights.quantize import row_segments

        segments = row_segments(rows, self.checkpoint)
        if not segments:
            return "computed from checkpoint tensors (dequantized)"
        schemes = [
            self.checkpoint.kept_scheme(t, target=self.target, gather=gather, errors=self.errors)
            for t in dict.fromkeys(name for name, _, _ in segments)
        ]
        refused = [s for s in schemes if isinstance(s, str)]
        if refused:
            return refused[0]
        if any(s != schemes[0] for s in schemes):
            return "made of tensors stored in different types (dequantized)"
        return schemes[0]

    def source_type(self, tensor: str | None) -> str | None:
        """The GGUF type of a report's ``source`` (tensors joined by ", " share one)."""
        info = self.checkpoint.tensors.get(tensor.split(", ")[0]) if tensor else None
        return getattr(info, "ggml_type", None)

    def manifest_entry(
        self, options: BuildOptions, reports: Mapping[str, ComponentQuant], graphs: Any
    ) -> dict[str, Any]:
        """The manifest's ``"quantization"`` object: per tensor its op, bits, block
        size, zero points and source (GGUF) tensor and type."""
        components: dict[str, Any] = {}
        for name, report in reports.items():
            q_bytes, f_bytes = initializer_bytes(graphs[name], report.initializers)
            tensors = {
                t: {**entry, "source_type": self.source_type(entry.get("source"))}
                for t, entry in sorted(report.tensors.items())
            }
            components[name] = {
                "tensors": tensors,
                "kept_float": dict(sorted(report.kept_float.items())),
                "quantized_bytes": q_bytes,
                "other_bytes": f_bytes,
            }
        return {
            "method": KEPT_METHOD,
            "format": "gguf",
            "accuracy_level": QuantOptions().level_for(options.target),
            "activation_dtype": options.port_dtype,
            "components": components,
        }

    def dequantized(self, reports: Mapping[str, ComponentQuant]) -> list[str]:
        """One line per reason a quantized source tensor was dequantized."""
        by_why: dict[str, list[str]] = {}
        for report in reports.values():
            for tensor, why in report.kept_float.items():
                if "dequantized" in why:
                    by_why.setdefault(why, []).append(tensor)
        lines = []
        for why, names in sorted(by_why.items()):
            shown = ", ".join(names[:4]) + (f" … ({len(names)} in all)" if len(names) > 4 else "")
            lines.append(f"kept float: {shown}: {why}")
        return lines

    def corrected(self, reports: Mapping[str, ComponentQuant]) -> list[str]:
        """One line per GGUF type kept exactly as int4 levels plus block corrections
        (``--target cpu``'s form of Q4_1 / Q4_K MatMul weights)."""
        counts: dict[str, int] = {}
        for report in reports.values():
            for entry in report.tensors.values():
                if entry.get("correction"):
                    kind = self.source_type(entry.get("source")) or "?"
                    counts[kind] = counts.get(kind, 0) + 1
        return [
            f"--target cpu: {n} {kind} tensor(s) kept exactly as int4 blocks plus "
            "block-sum corrections"
            for kind, n in sorted(counts.items())
        ]

    def approximations(self) -> dict[str, tuple[float, int]]:
        """GGUF type → (largest |weight error|, tensors) of the ``--target cpu`` forms,
        known once the tensors were written."""
        return {
            key: (value, len(self.errors.tensors.get(key, ())))
            for key, value in sorted(self.errors.largest.items())
        }
