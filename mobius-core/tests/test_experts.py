"""``route`` and ``RoutedExperts`` in a tiny graph, run in onnxruntime CPU, against numpy.

The numpy reference is HF's per-expert loop (``Gemma4TextExperts`` / ``Qwen3MoeExperts``):
softmax in float32, top-k, optional renormalisation, then for every expert the tokens that
picked it, ``down(act(gate) · up)`` weighted and summed.
"""

from __future__ import annotations

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

ort = pytest.importorskip("onnxruntime")

H, INTER = 16, 12


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


def _model(E, k, act="silu", dtype="float32", softmax_first=True, norm=True):
    graph, _, op = new_graph("moe")
    x = add_input(op, "x", dtype, ("T", H))
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
def test_routed_experts_match_per_expert_loop(act, softmax_first, norm, tokens) -> None:
    E, k = 6, 2
    rng = np.random.default_rng(tokens)
    model, block = _model(E, k, act, softmax_first=softmax_first, norm=norm)
    a = _weights(block, E, rng, np.float32)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    y, w, idx = _session(model).run(None, {"x": x})
    ref, ref_w, ref_idx = _reference(x, a, E, k, act, softmax_first, norm)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_unpicked_experts_are_never_read() -> None:
    """NaN in every expert no token picked leaves the output finite: those slabs are never
    gathered, unlike a dense formulation (0 · NaN = NaN)."""
    E, k, tokens = 8, 2, 3
    rng = np.random.default_rng(7)
    model, block = _model(E, k)
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
