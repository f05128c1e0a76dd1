"""``route`` and ``RoutedExperts`` in a tiny graph, run in onnxruntime CPU, against numpy.

The numpy reference is HF's per-expert loop (``Gemma4TextExperts`` / ``Qwen3MoeExperts``):
softmax in float32, top-k, optional renormalisation, then for every expert the tokens that
picked it, ``down(act(gate) · up)`` weighted and summed.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnxscript import nn

from mobius.components import (
    Linear,
    RoutedExperts,
    add_input,
    add_output,
    finish_model,
    new_graph,
    route,
)
from mobius.components.experts import decode_weight_bytes, dense_formulation, expert_tables

ort = pytest.importorskip("onnxruntime")

H, INTER = 32, 16


class _Block(nn.Module):
    def __init__(self, E: int, k: int, act: str, dtype: str, softmax_first: bool, norm: bool):
        super().__init__()
        self.k, self.softmax_first, self.norm = k, softmax_first, norm
        self.router = Linear(H, E, dtype=dtype)
        self.experts = RoutedExperts(E, H, INTER, act, dtype=dtype)

    def forward(self, op, x):
        w, idx = route(
            op,
            self.router(op, x),
            self.k,
            softmax_first=self.softmax_first,
            normalize=self.norm,
        )
        return self.experts(op, x, w, idx), w, idx


def _model(E, k, act="silu", dtype="float32", softmax_first=True, norm=True, dense=False):
    graph, _, op = new_graph("moe")
    x = add_input(op, "x", dtype, ("T", H))
    with dense_formulation() if dense else contextlib.nullcontext():
        block = _Block(E, k, act, dtype, softmax_first, norm)
    y, w, idx = block(op, x)
    add_output(op, y, "y", dtype=dtype, shape=("T", H))
    add_output(op, w, "w", dtype="float32", shape=("T", k))
    add_output(op, idx, "idx", dtype="int64", shape=("T", k))
    return finish_model(graph), block


def _weights(block: _Block, E: int, rng, np_dtype) -> dict[str, np.ndarray]:
    arrays = {
        "router": rng.standard_normal((H, E)),
        "gate_up": rng.standard_normal((E, H, 2 * INTER)) * 0.3,
        "down": rng.standard_normal((E, INTER, H)) * 0.3,
    }
    arrays = {k: v.astype(np_dtype) for k, v in arrays.items()}
    block.router.weight.const_value = ir.tensor(arrays["router"])
    block.experts.gate_up_proj.const_value = ir.tensor(arrays["gate_up"])
    block.experts.down_proj.const_value = ir.tensor(arrays["down"])
    return arrays


def _session(model: ir.Model):
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _act(x: np.ndarray, name: str) -> np.ndarray:
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))


def _reference(x, a, E, k, act, softmax_first, norm):
    """HF's router + per-expert loop in float64."""
    x = x.astype(np.float64)
    logits = x @ a["router"].astype(np.float64)
    if softmax_first:
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
        w = np.take_along_axis(p, idx, -1)
        if norm:
            w = w / w.sum(-1, keepdims=True)
    else:
        idx = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        top = np.take_along_axis(logits, idx, -1)
        w = np.exp(top - top.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for e in range(E):
        tok, pick = np.nonzero(idx == e)
        if tok.size == 0:
            continue
        gu = x[tok] @ a["gate_up"][e].astype(np.float64)
        y = (_act(gu[:, :INTER], act) * gu[:, INTER:]) @ a["down"][e].astype(np.float64)
        np.add.at(out, tok, y * w[tok, pick, None])
    return out, w, idx


@pytest.mark.parametrize(
    ("act", "softmax_first", "norm"),
    [("silu", True, True), ("silu", True, False), ("gelu_tanh", True, True), ("silu", False, True)],
)
@pytest.mark.parametrize("tokens", [1, 3, 40])
@pytest.mark.parametrize("dense", [False, True], ids=["routed", "dense"])
def test_routed_experts_match_per_expert_loop(act, softmax_first, norm, tokens, dense) -> None:
    E, k = 6, 2
    rng = np.random.default_rng(tokens)
    model, block = _model(E, k, act, softmax_first=softmax_first, norm=norm, dense=dense)
    a = _weights(block, E, rng, np.float32)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    y, w, idx = _session(model).run(None, {"x": x})
    ref, ref_w, ref_idx = _reference(x, a, E, k, act, softmax_first, norm)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dense", [False, True], ids=["routed", "dense"])
def test_unpicked_experts_are_never_read(dense) -> None:
    """NaN in every expert no token picked leaves the routed output finite: those slabs are
    never gathered. The dense formulation multiplies them (0 · NaN = NaN)."""
    E, k, tokens = 8, 2, 3
    rng = np.random.default_rng(7)
    model, block = _model(E, k, dense=dense)
    a = _weights(block, E, rng, np.float32)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    _, _, idx = _session(model).run(None, {"x": x})
    unpicked = sorted(set(range(E)) - set(idx.ravel().tolist()))
    assert unpicked, "the seeded routing should leave some expert unpicked"
    for name in ("gate_up", "down"):
        a[name][unpicked] = np.nan
    block.experts.gate_up_proj.const_value = ir.tensor(a["gate_up"])
    block.experts.down_proj.const_value = ir.tensor(a["down"])
    y, _, idx2 = _session(model).run(None, {"x": x})
    np.testing.assert_array_equal(idx2, idx)
    if dense:
        assert np.isnan(y).all()
        return
    assert np.isfinite(y).all()
    ref, _, _ = _reference(x, a, E, k, "silu", True, True)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_expert_tables_are_only_gathered_by_hit_experts() -> None:
    """Graph structure: each expert table feeds exactly one ``Gather`` (axis 0) whose
    indices come from ``NonZero`` of the hit mask, so a step reads only hit experts."""
    model, _ = _model(8, 2)
    proto = ir.serde.serialize_model(model)
    producer = {o: n for n in proto.graph.node for o in n.output}
    for table in ("experts.gate_up_proj", "experts.down_proj"):
        users = [n for n in proto.graph.node if table in n.input]
        assert [n.op_type for n in users] == ["Gather"], (table, users)
        (gather,) = users
        assert gather.input[0] == table
        assert {a.name: a.i for a in gather.attribute}.get("axis", 0) == 0
        idx_src = producer[producer[gather.input[1]].input[0]]  # Reshape(NonZero(...))
        assert idx_src.op_type == "NonZero"
    names = sorted(v.name for v in expert_tables(model.graph))
    assert names == ["experts.down_proj", "experts.gate_up_proj"]
    tables = 8 * (H * 2 * INTER + INTER * H) * 4
    routed, dense = decode_weight_bytes(model.graph, 8, 2)
    assert dense - routed == tables - tables * 2 // 8  # 6 of 8 experts never read
    assert dense - tables >= H * 8 * 4  # the router (and small constants) read in full


def test_dense_graph_has_no_expert_tables() -> None:
    """The dense formulation reads every expert: nothing is found to be gathered by hit."""
    model, _ = _model(8, 2, dense=True)
    assert expert_tables(model.graph) == []
    routed, dense = decode_weight_bytes(model.graph, 8, 2)
    assert routed == dense


def test_half_precision_experts() -> None:
    E, k, tokens = 5, 2, 9
    rng = np.random.default_rng(3)
    model, block = _model(E, k, "gelu_tanh", dtype="float16")
    a = _weights(block, E, rng, np.float16)
    x = rng.standard_normal((tokens, H)).astype(np.float16)
    y, _, idx = _session(model).run(None, {"x": x})
    ref, _, ref_idx = _reference(x, a, E, k, "gelu_tanh", True, True)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=2e-2, atol=2e-2)


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        RoutedExperts(4, H, INTER, "relu")


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_experts_read_only_picked_blocks(tmp_path, symmetric) -> None:
    """``--quant int4`` (core quantization) on a RoutedExperts graph: each expert table is
    read by a GatherBlockQuantized of the hit experts; the output equals the per-expert loop
    on the dequantized weights, and NaN scales of unpicked experts never reach it."""
    from safetensors.numpy import save_file

    from mobius.checkpoint import open_local
    from mobius.quantization import quantize_component
    from mobius.records import QuantOptions
    from mobius.weights import WeightPlan, ref
    from mobius.weights.quantize import dequantize_rows, quantize_experts

    E, k, tokens, block = 8, 2, 3, 16
    rng = np.random.default_rng(5)
    model, _ = _model(E, k)
    hf = {  # HF layouts: gate_up [E, 2I, H], down [E, H, I], router [E, H]
        "router": rng.standard_normal((E, H)).astype(np.float32),
        "gate_up": (rng.standard_normal((E, 2 * INTER, H)) * 0.3).astype(np.float32),
        "down": (rng.standard_normal((E, H, INTER)) * 0.3).astype(np.float32),
    }
    save_file(hf, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"model_type": "x"}')
    plan = WeightPlan()
    plan.add("router.weight", ref("router").transpose())
    plan.add("experts.gate_up_proj", ref("gate_up").transpose([0, 2, 1]))
    plan.add("experts.down_proj", ref("down").transpose([0, 2, 1]))
    quant = QuantOptions("int4", block_size=block, symmetric=symmetric, exclude=("router.*",))
    plan, report = quantize_component(model, plan, quant)
    assert sorted(report.tensors) == ["experts.down_proj", "experts.gate_up_proj"]
    assert report.tensors["experts.gate_up_proj"]["ops"] == ["GatherBlockQuantized"]
    ckpt = open_local(tmp_path)
    arrays = {name: expr.evaluate(ckpt) for name, expr in plan.entries.items()}
    for name, array in arrays.items():
        model.graph.initializers[name].const_value = ir.tensor(array)
    tables = sorted(v.name for v in expert_tables(model.graph))
    assert [t for t in tables if t.endswith(".quant")] == [
        "experts.down_proj.quant",
        "experts.gate_up_proj.quant",
    ]
    routed, dense = decode_weight_bytes(model.graph, E, k)
    assert routed < dense / 2

    # reference: HF's loop on the dequantized weights (each expert quantized as MatMulNBits)
    deq = {}
    for key in ("gate_up", "down"):
        q = quantize_experts(hf[key], bits=4, block_size=block, symmetric=symmetric)
        kk = hf[key].shape[2]
        deq[key] = np.stack(
            [
                dequantize_rows(
                    type(q)(
                        q.packed[e],
                        q.scales[e],
                        None if q.zero_points is None else q.zero_points[e],
                    ),
                    kk,
                    bits=4,
                    block_size=block,
                ).T
                for e in range(E)
            ]
        )  # [E, in, out], the graph layout
    a = {"router": hf["router"].T, "gate_up": deq["gate_up"], "down": deq["down"]}
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    y, _, idx = _session(model).run(None, {"x": x})
    ref_y, _, ref_idx = _reference(x, a, E, k, "silu", True, True)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(y, ref_y, rtol=1e-4, atol=1e-5)

    unpicked = sorted(set(range(E)) - set(idx.ravel().tolist()))
    assert unpicked
    scales = arrays["experts.gate_up_proj.scales"].copy()
    assert scales.shape[0] == E  # [E, N, n_blocks, 1]: expert first
    scales[unpicked] = np.nan
    model.graph.initializers["experts.gate_up_proj.scales"].const_value = ir.tensor(scales)
    y2, _, _ = _session(model).run(None, {"x": x})
    np.testing.assert_array_equal(y2, y)
