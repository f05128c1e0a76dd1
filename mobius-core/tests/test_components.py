"""Each shared component in a tiny graph, run in onnxruntime CPU, against numpy."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from mobius.components import (
    Attention,
    Embedding,
    GatedMLP,
    GroupQueryAttention,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    add_input,
    add_output,
    additive_attention_mask,
    finish_model,
    gqa_lengths,
    new_graph,
    rotary_tables,
)
from mobius.onnx_versions import IR_VERSION, OPSET

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(0)
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _randn(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _set(param: ir.Value, array: np.ndarray) -> None:
    param.const_value = ir.tensor(array)


def _session(model: ir.Model) -> ort.InferenceSession:
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.ir_version == IR_VERSION
    assert {o.domain: o.version for o in proto.opset_import}[""] == OPSET
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return _session(model).run(None, feeds)


# ---------------------------------------------------------------- numpy references


def _rms_ref(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * w.astype(np.float64)
    return y


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rope_ref(x: np.ndarray, inv_freq: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """x [B, H, S, D], positions [B, S] -> HF apply_rotary_pos_emb."""
    freqs = positions[..., None].astype(np.float64) * inv_freq.astype(np.float64)
    emb = np.concatenate([freqs, freqs], axis=-1)  # [B, S, D]
    cos, sin = np.cos(emb)[:, None], np.sin(emb)[:, None]
    return x * cos + _rotate_half(x) * sin


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention_ref(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    allowed: np.ndarray,
    scale: float,
    softcap: float = 0.0,
) -> np.ndarray:
    """q [B, N, S, D], k/v [B, KV, T, D], allowed [B or 1, 1, S, T] -> [B, S, N*D]."""
    b, n, s, d = q.shape
    rep = n // k.shape[1]
    k = np.repeat(k, rep, axis=1).astype(np.float64)
    v = np.repeat(v, rep, axis=1).astype(np.float64)
    scores = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) * scale
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    scores = np.where(allowed, scores, -1e30)
    out = _softmax(scores) @ v
    return out.transpose(0, 2, 1, 3).reshape(b, s, n * d)


def _causal_allowed(total: int, steps: int, window: int | None = None) -> np.ndarray:
    q_pos = np.arange(total - steps, total)[:, None]
    kv = np.arange(total)[None, :]
    allowed = kv <= q_pos
    if window is not None:
        allowed &= (q_pos - kv) < window
    return allowed[None, None]


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    """[B, S, n*D] -> [B, n, S, D]."""
    b, s, hd = x.shape
    return x.reshape(b, s, n, hd // n).transpose(0, 2, 1, 3)


# ---------------------------------------------------------------- simple modules


@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_numpy(bias: bool) -> None:
    graph, _, op = new_graph("linear")
    x = add_input(op, "x", "float32", ("batch", "seq", 8))
    lin = Linear(8, 6, bias=bias, name="proj")
    add_output(op, lin(op, x), "y")
    w, b = _randn(8, 6), _randn(6)
    _set(lin.weight, w)
    if bias:
        _set(lin.bias, b)
    assert lin.weight.name == "proj.weight"
    assert list(lin.weight.shape) == [8, 6]
    xv = _randn(2, 3, 8)
    (y,) = _run(finish_model(graph), {"x": xv})
    np.testing.assert_allclose(y, xv @ w + (b if bias else 0), **TOL)


@pytest.mark.parametrize("with_weight", [True, False])
def test_rmsnorm_f32(with_weight: bool) -> None:
    graph, _, op = new_graph("norm")
    x = add_input(op, "x", "float32", ("batch", "seq", 16))
    norm = RMSNorm(16, eps=1e-6, with_weight=with_weight, name="norm")
    add_output(op, norm(op, x), "y")
    w = _randn(16) if with_weight else None
    if with_weight:
        _set(norm.weight, w)
        assert [p.name for p in norm.parameters()] == ["norm.weight"]
    else:
        assert list(norm.parameters()) == []
        assert not graph.initializers or "norm.weight" not in graph.initializers
    xv = _randn(2, 3, 16, scale=3.0)
    (y,) = _run(finish_model(graph), {"x": xv})
    np.testing.assert_allclose(y, _rms_ref(xv, w, 1e-6), **TOL)


@pytest.mark.parametrize("with_weight", [True, False])
def test_rmsnorm_f16_large_values_do_not_overflow(with_weight: bool) -> None:
    graph, _, op = new_graph("norm16")
    x = add_input(op, "x", "float16", ("batch", "seq", 32))
    norm = RMSNorm(32, eps=1e-6, with_weight=with_weight, dtype="float16", name="norm")
    add_output(op, norm(op, x), "y")
    w = (RNG.standard_normal(32) + 1).astype(np.float16) if with_weight else None
    if with_weight:
        _set(norm.weight, w)
    # 888² ≈ 788k overflows float16; the sum of squares must be taken in float32.
    xv = (888.0 * np.sign(RNG.standard_normal((2, 3, 32)))).astype(np.float16)
    xv[0, 0, :4] = 60000
    (y,) = _run(finish_model(graph), {"x": xv})
    assert y.dtype == np.float16
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y.astype(np.float32), _rms_ref(xv, w, 1e-6), rtol=2e-3, atol=2e-3)


def test_embedding_gathers_rows() -> None:
    graph, _, op = new_graph("embed")
    ids = add_input(op, "input_ids", "int64", ("batch", "seq"))
    emb = Embedding(11, 4, name="embed_tokens")
    add_output(op, emb(op, ids), "inputs_embeds")
    table = _randn(11, 4)
    _set(emb.weight, table)
    idv = np.array([[0, 3, 10], [7, 7, 1]], dtype=np.int64)
    (y,) = _run(finish_model(graph), {"input_ids": idv})
    np.testing.assert_array_equal(y, table[idv])


@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
def test_gated_mlp(act: str) -> None:
    graph, _, op = new_graph("mlp")
    x = add_input(op, "x", "float32", ("batch", "seq", 8))
    mlp = GatedMLP(8, 12, activation=act, name="mlp")
    add_output(op, mlp(op, x), "y")
    wg, wu, wd = _randn(8, 12), _randn(8, 12), _randn(12, 8)
    _set(mlp.gate_proj.weight, wg)
    _set(mlp.up_proj.weight, wu)
    _set(mlp.down_proj.weight, wd)
    names = sorted(p.name for p in mlp.parameters())
    assert names == ["mlp.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight"]
    xv = _randn(2, 3, 8)
    g = xv.astype(np.float64) @ wg
    if act == "gelu_tanh":
        a = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    else:
        a = g / (1 + np.exp(-g))
    ref = (a * (xv.astype(np.float64) @ wu)) @ wd
    (y,) = _run(finish_model(graph), {"x": xv})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=2e-5)


# ---------------------------------------------------------------- rotary


def _rope_inv_freq(head_dim: int, partial: bool) -> np.ndarray:
    inv = 1.0 / (10000.0 ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if partial:  # proportional / partial rope: the upper pairs are not rotated
        inv[head_dim // 4 :] = 0.0
    return inv


def test_rotary_tables_split_half_layout() -> None:
    inv = _rope_inv_freq(8, partial=True)
    cos, sin = rotary_tables(inv, 6, scaling=0.5)
    assert cos.shape == sin.shape == (6, 4)
    assert cos.dtype == np.float32
    np.testing.assert_allclose(cos[3, 1], 0.5 * np.cos(3 * inv[1]), rtol=1e-6)
    np.testing.assert_allclose(cos[:, 2:], 0.5)  # zero inv_freq: cos = scaling, sin = 0
    np.testing.assert_allclose(sin[:, 2:], 0.0)


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("layout", ["bsd", "bnsd"])
def test_rotary_matches_rotate_half(partial: bool, layout: str) -> None:
    heads, hd = 3, 8
    inv = _rope_inv_freq(hd, partial)
    graph, _, op = new_graph("rope")
    pos = add_input(op, "position_ids", "int64", ("batch", "seq"))
    if layout == "bsd":
        x = add_input(op, "x", "float32", ("batch", "seq", heads * hd))
    else:
        x = add_input(op, "x", "float32", ("batch", heads, "seq", hd))
    rope = RotaryEmbedding(inv, 32, name="rotary")
    cos, sin = rope.gather(op, pos)
    add_output(op, rope(op, x, cos, sin, num_heads=heads if layout == "bsd" else None), "y")
    assert set(graph.initializers) >= {"rotary.cos_cache", "rotary.sin_cache"}

    posv = np.array([[0, 1, 2, 3], [5, 9, 17, 31]], dtype=np.int64)
    x4 = _randn(2, heads, 4, hd)
    ref = _rope_ref(x4, inv, posv)
    feed = x4 if layout == "bnsd" else x4.transpose(0, 2, 1, 3).reshape(2, 4, heads * hd)
    (y,) = _run(finish_model(graph), {"x": feed, "position_ids": posv})
    if layout == "bsd":
        y = _heads(y, heads)
    np.testing.assert_allclose(y, ref, **TOL)
    if partial:  # the non-rotated pairs pass through untouched
        np.testing.assert_allclose(y[..., 2:4], x4[..., 2:4], **TOL)
        np.testing.assert_allclose(y[..., 6:8], x4[..., 6:8], **TOL)


def test_rotary_with_position_ids_and_tables_in_f16() -> None:
    heads, hd = 2, 8
    inv = _rope_inv_freq(hd, partial=False)
    graph, _, op = new_graph("rope16")
    pos = add_input(op, "position_ids", "int64", ("batch", "seq"))
    x = add_input(op, "x", "float16", ("batch", "seq", heads * hd))
    rope = RotaryEmbedding(inv, 16, dtype="float16", name="rotary")
    cos, sin = rope.tables(op)
    assert rope.tables(op) == (cos, sin)  # created once per graph
    add_output(op, rope(op, x, cos, sin, pos, num_heads=heads), "y")
    posv = np.array([[2, 3, 4]], dtype=np.int64)
    x4 = _randn(1, heads, 3, hd)
    feed = x4.transpose(0, 2, 1, 3).reshape(1, 3, heads * hd).astype(np.float16)
    (y,) = _run(finish_model(graph), {"x": feed, "position_ids": posv})
    assert y.dtype == np.float16
    ref = _rope_ref(
        feed.astype(np.float32).reshape(1, 3, heads, hd).transpose(0, 2, 1, 3), inv, posv
    )
    np.testing.assert_allclose(_heads(y.astype(np.float32), heads), ref, rtol=5e-3, atol=5e-3)


# ---------------------------------------------------------------- attention


def _attention_model(heads: int, kv: int, hd: int, window: int | None, softcap: float):
    graph, _, op = new_graph("attn")
    q = add_input(op, "q", "float32", ("batch", "seq", heads * hd))
    k = add_input(op, "k", "float32", ("batch", "seq", kv * hd))
    v = add_input(op, "v", "float32", ("batch", "seq", kv * hd))
    mask_in = add_input(op, "attention_mask", "int64", ("batch", "total"))
    pk = add_input(op, "past_key", "float32", ("batch", kv, "past", hd))
    pv = add_input(op, "past_value", "float32", ("batch", kv, "past", hd))
    mask = additive_attention_mask(op, mask_in, q, sliding_window=window)
    attn = Attention(heads, kv, hd, scale=0.3, softcap=softcap, name="attn")
    out, pres_k, pres_v = attn(op, q, k, v, mask, pk, pv)
    add_output(op, out, "out")
    add_output(op, pres_k, "present_key")
    add_output(op, pres_v, "present_value")
    return _session(finish_model(graph))


@pytest.mark.parametrize(("window", "softcap"), [(None, 0.0), (3, 0.0), (None, 2.0)])
def test_attention_prefill_then_decode_equals_full(window: int | None, softcap: float) -> None:
    heads, kv, hd, steps = 4, 2, 8, 6
    sess = _attention_model(heads, kv, hd, window, softcap)
    q, k, v = (
        _randn(2, steps + 1, heads * hd),
        _randn(2, steps + 1, kv * hd),
        _randn(2, steps + 1, kv * hd),
    )
    mask = np.ones((2, steps + 1), dtype=np.int64)
    mask[1, :2] = 0  # left padding in row 1
    empty = np.zeros((2, kv, 0, hd), dtype=np.float32)

    out_p, pk, pv = sess.run(
        None,
        {
            "q": q[:, :steps],
            "k": k[:, :steps],
            "v": v[:, :steps],
            "attention_mask": mask[:, :steps],
            "past_key": empty,
            "past_value": empty,
        },
    )
    out_d, pk2, pv2 = sess.run(
        None,
        {
            "q": q[:, steps:],
            "k": k[:, steps:],
            "v": v[:, steps:],
            "attention_mask": mask,
            "past_key": pk,
            "past_value": pv,
        },
    )
    out_f, fk, fv = sess.run(
        None,
        {"q": q, "k": k, "v": v, "attention_mask": mask, "past_key": empty, "past_value": empty},
    )
    assert pk.shape == (2, kv, steps, hd) and pk2.shape == (2, kv, steps + 1, hd)
    np.testing.assert_allclose(pk2, fk, **TOL)
    np.testing.assert_allclose(pv2, fv, **TOL)

    allowed = _causal_allowed(steps + 1, steps + 1, window) & (mask[:, None, None, :] == 1)
    ref = _attention_ref(_heads(q, heads), _heads(k, kv), _heads(v, kv), allowed, 0.3, softcap)
    real = mask == 1  # padded query rows attend to nothing; their output is unspecified
    np.testing.assert_allclose(out_f[real], ref[real], **TOL)
    np.testing.assert_allclose(out_p[real[:, :steps]], ref[:, :steps][real[:, :steps]], **TOL)
    np.testing.assert_allclose(out_d[:, 0], ref[:, steps], **TOL)


def _gqa_model(heads: int, kv: int, hd: int, inv: np.ndarray, window: int):
    graph, _, op = new_graph("gqa")
    q = add_input(op, "q", "float32", ("batch", "seq", heads * hd))
    k = add_input(op, "k", "float32", ("batch", "seq", kv * hd))
    v = add_input(op, "v", "float32", ("batch", "seq", kv * hd))
    mask_in = add_input(op, "attention_mask", "int64", ("batch", "total"))
    pk = add_input(op, "past_key", "float32", ("batch", kv, "past", hd))
    pv = add_input(op, "past_value", "float32", ("batch", kv, "past", hd))
    rope = RotaryEmbedding(inv, 64, name="rotary")
    cos, sin = rope.tables(op)
    seqlens_k, total = gqa_lengths(op, mask_in)
    gqa = GroupQueryAttention(heads, kv, hd, scale=0.25, local_window_size=window, name="attn")
    out, pres_k, pres_v = gqa(op, q, k, v, pk, pv, seqlens_k, total, cos, sin)
    add_output(op, out, "out")
    add_output(op, pres_k, "present_key")
    add_output(op, pres_v, "present_value")
    return _session(finish_model(graph))


@pytest.mark.parametrize("window", [-1, 2])
def test_group_query_attention_prefill_and_decode(window: int) -> None:
    heads, kv, hd, steps, batch = 4, 2, 16, 5, 2  # ORT rotary needs head_dim % 16 == 0
    inv = _rope_inv_freq(hd, partial=False)
    sess = _gqa_model(heads, kv, hd, inv, window)
    total = steps + 1
    q, k, v = (
        _randn(batch, total, heads * hd),
        _randn(batch, total, kv * hd),
        _randn(batch, total, kv * hd),
    )
    mask = np.ones((batch, total), dtype=np.int64)
    empty = np.zeros((batch, kv, 0, hd), dtype=np.float32)
    out_p, pk, pv = sess.run(
        None,
        {
            "q": q[:, :steps],
            "k": k[:, :steps],
            "v": v[:, :steps],
            "attention_mask": mask[:, :steps],
            "past_key": empty,
            "past_value": empty,
        },
    )
    out_d, pk2, _ = sess.run(
        None,
        {
            "q": q[:, steps:],
            "k": k[:, steps:],
            "v": v[:, steps:],
            "attention_mask": mask,
            "past_key": pk,
            "past_value": pv,
        },
    )
    positions = np.broadcast_to(np.arange(total), (batch, total))
    q_rot = _rope_ref(_heads(q, heads), inv, positions)
    k_rot = _rope_ref(_heads(k, kv), inv, positions)
    # onnxruntime's local_window_size W keeps W keys (the query's own included), as HF sliding_window
    allowed = _causal_allowed(total, total, window if window > 0 else None)
    ref = _attention_ref(q_rot, k_rot, _heads(v, kv), allowed, 0.25)
    np.testing.assert_allclose(pk2, k_rot, **TOL)  # the cache holds rotated keys
    np.testing.assert_allclose(out_p, ref[:, :steps], **TOL)
    np.testing.assert_allclose(out_d[:, 0], ref[:, steps], **TOL)


# ---------------------------------------------------------------- graph helpers


def test_add_output_keeps_input_and_initializer_names() -> None:
    graph, _, op = new_graph("passthrough")
    x = add_input(op, "x", "float32", ("batch", 4))
    emb = Embedding(5, 4, name="embed_tokens")
    add_output(op, x, "y")  # a graph input: routed through Identity, input keeps its name
    add_output(op, emb.weight, "table", dtype="float32", shape=(5, 4))
    emb(op, op.Constant(value_ints=[0]))  # realize the parameter
    table = _randn(5, 4)
    _set(emb.weight, table)
    assert [v.name for v in graph.inputs] == ["x"]
    assert "embed_tokens.weight" in graph.initializers
    xv = _randn(3, 4)
    y, t = _run(finish_model(graph), {"x": xv})
    np.testing.assert_array_equal(y, xv)
    np.testing.assert_array_equal(t, table)


def test_add_output_without_shape_is_refused() -> None:
    _, _, op = new_graph("noshape")
    x = add_input(op, "x", "float32", ("batch", 4))
    y = op.Relu(x)
    y.shape = None
    with pytest.raises(ValueError, match="pass dtype= and shape="):
        add_output(op, y, "y")
