"""The pieces added to mobius.components for a second family (Qwen3) and Gemma 4's move
onto them: mask overlays, RMSNorm variants, in-graph rotary, transposed head, GQA choice.
(HF bit-exactness of ``rope_inv_freq`` is checked against transformers in mobius-qwen3's
reference tests; here the numpy formulas.)"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from mobius.components import (
    RMSNorm,
    add_input,
    add_output,
    allowed_positions,
    apply_rotary,
    finish_model,
    gqa_available,
    linear_transposed,
    new_graph,
    rope_inv_freq,
    rotary_cos_sin,
)

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(3)


def _run(graph, feeds):
    proto = ir.serde.serialize_model(finish_model(graph))
    onnx.checker.check_model(proto, full_check=True)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("within", [True, False])
@pytest.mark.parametrize("window", [None, 3])
def test_allowed_positions_with_overlay(window, within):
    """``also`` ORs extra pairs before (default) or after the window; padding always wins."""
    total, steps = 7, 5
    graph, _, op = new_graph("mask")
    mask = add_input(op, "attention_mask", "int64", ("batch", "total"))
    query = add_input(op, "query", "float32", ("batch", "steps", 2))
    extra = add_input(op, "extra", "bool", ("batch", 1, "steps", "total"))
    out = allowed_positions(
        op, mask, query, sliding_window=window, also=extra, also_within_window=within
    )
    add_output(op, out, "allowed", dtype="bool", shape=("batch", 1, "steps", "total"))
    am = np.ones((2, total), np.int64)
    am[1, 0] = 0
    ex = RNG.random((2, 1, steps, total)) < 0.3
    (got,) = _run(
        graph, {"attention_mask": am, "query": np.zeros((2, steps, 2), np.float32), "extra": ex}
    )
    q = np.arange(total - steps, total)[:, None]
    k = np.arange(total)[None, :]
    causal, win = k <= q, np.ones_like(k <= q) if window is None else (q - k) < window
    want = ((causal | ex) & win) if within else ((causal & win) | ex)
    want = want & (am[:, None, None, :] != 0)
    np.testing.assert_array_equal(got, want)


def _rms(x, w, eps=1e-6):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize(("offset", "after"), [(1.0, False), (0.0, True), (1.0, True)])
def test_rmsnorm_variants(offset, after):
    """``1 + w`` (weight_offset) and weight-after-cast in float16 against float64 numpy."""
    graph, _, op = new_graph("norm")
    x = add_input(op, "x", "float16", ("b", 8))
    norm = RMSNorm(8, weight_offset=offset, weight_after_cast=after, dtype="float16", name="n")
    add_output(op, norm(op, x), "y")
    w = (RNG.standard_normal(8) * 0.1).astype(np.float16)
    norm.weight.const_value = ir.tensor(w)
    xv = (RNG.standard_normal((3, 8)) * 4).astype(np.float16)
    (y,) = _run(graph, {"x": xv})
    np.testing.assert_allclose(y, _rms(xv, w.astype(np.float64) + offset), rtol=5e-3, atol=5e-3)


def test_rope_inv_freq_formulas():
    inv, scale = rope_inv_freq({"rope_type": "default", "rope_theta": 10000.0}, 8)
    np.testing.assert_allclose(inv, 10000.0 ** -(np.arange(0, 8, 2) / 8), rtol=1e-6)
    assert scale == 1.0
    lin, _ = rope_inv_freq({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, 8)
    np.testing.assert_allclose(lin, inv / 2, rtol=1e-6)
    prop, _ = rope_inv_freq(
        {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, 8
    )
    np.testing.assert_allclose(prop, [1.0, 10000.0 ** -(2 / 8), 0.0, 0.0], rtol=1e-6)
    part, _ = rope_inv_freq(
        {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, 8
    )
    assert part.shape == (2,)
    _, yarn_scale = rope_inv_freq(
        {
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        8,
        256,
    )
    assert yarn_scale == pytest.approx(0.1 * np.log(4.0) + 1.0)
    with pytest.raises(ValueError, match="rope_type"):
        rope_inv_freq({"rope_type": "dynamic", "rope_theta": 1e4}, 8)


@pytest.mark.parametrize("rotary_dim", [0, 4])
def test_rotary_cos_sin_and_apply(rotary_dim):
    """HF ``q·cos + rotate_half(q)·sin`` on the first ``rotary_dim`` dims (all when 0)."""
    hd, heads = 8, 2
    rd = rotary_dim or hd
    inv = (1.0 / (100.0 ** (np.arange(0, rd, 2) / rd))).astype(np.float32)
    graph, _, op = new_graph("rope")
    x = add_input(op, "x", "float32", ("b", "s", heads * hd))
    pos = add_input(op, "pos", "int64", ("b", "s"))
    cos, sin = rotary_cos_sin(op, inv, pos, "float32", scaling=1.5)
    y = apply_rotary(op, x, cos, sin, num_heads=heads, rotary_dim=rotary_dim)
    add_output(op, y, "y", dtype="float32", shape=("b", "s", heads * hd))
    xv = RNG.standard_normal((1, 3, heads * hd)).astype(np.float32)
    pv = np.array([[0, 5, 9]], np.int64)
    (got,) = _run(graph, {"x": xv, "pos": pv})
    h = xv.reshape(1, 3, heads, hd).astype(np.float64)
    ang = pv[..., None] * inv.astype(np.float64)
    c = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, :, None] * 1.5
    s = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, :, None] * 1.5
    r = h[..., :rd]
    half = np.concatenate([-r[..., rd // 2 :], r[..., : rd // 2]], -1)
    want = np.concatenate([r * c + half * s, h[..., rd:]], -1).reshape(1, 3, heads * hd)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_linear_transposed_is_x_times_w_transposed():
    graph, _, op = new_graph("head")
    x = add_input(op, "x", "float32", ("b", "s", 4))
    w = add_input(op, "w", "float32", (6, 4))
    add_output(op, linear_transposed(op, x, w, 6), "y", dtype="float32", shape=("b", "s", 6))
    xv = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    wv = RNG.standard_normal((6, 4)).astype(np.float32)
    (y,) = _run(graph, {"x": xv, "w": wv})
    np.testing.assert_allclose(y, xv @ wv.T, rtol=1e-5, atol=1e-5)


def test_gqa_available_per_target():
    assert not gqa_available("default", "f32")
    assert gqa_available("cpu", "float32") and gqa_available("cpu", "f16")
    assert not gqa_available("cpu", "bf16") and not gqa_available("cuda", "f32")
    assert gqa_available("cuda", "bfloat16")
