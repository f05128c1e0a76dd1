"""onnxruntime's GroupQueryAttention past/present buffer sharing, checked against numpy.

The runtime's shared-KV mode (``mobius_runtime.kvshare``) relies on these
semantics of onnxruntime 1.31's CPU kernel; if a new onnxruntime changes them,
this test says so before any model gives a wrong token:

- past and present bound to one ``[B, kvh, M, hd]`` OrtValue share it: GQA writes the
  new rows at offset ``seqlens_k + 1 - S`` and attends ``total_sequence_length`` rows;
- that equals the concat path (past of exactly the valid length) and numpy;
- ``local_window_size = W`` attends the last W positions including the current one;
- a KV consumer (empty K/V, the producer's max-length buffer as past) attends the
  valid rows only.
"""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

B, N, KV, H, M = 1, 4, 2, 8, 24
STEPS = [(0, 5), (5, 1), (6, 1), (7, 2), (9, 1), (10, 1), (11, 1)]  # (past P, new S)


def _session(window: int, elem: int):
    from onnx import TensorProto, helper

    from mobius.onnx_versions import IR_VERSION, MS_OPSET, OPSET

    node = helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "pk", "pv", "sk", "tot"],
        ["y", "ok", "ov"],
        domain="com.microsoft",
        num_heads=N,
        kv_num_heads=KV,
        scale=1.0,
        local_window_size=window,
    )

    def f(name, shape):
        return helper.make_tensor_value_info(name, elem, shape)

    graph = helper.make_graph(
        [node],
        "gqa",
        [
            f("q", ["b", "s", N * H]),
            f("k", ["b", "t", KV * H]),
            f("v", ["b", "t", KV * H]),
            f("pk", ["b", KV, "p", H]),
            f("pv", ["b", KV, "p", H]),
            helper.make_tensor_value_info("sk", TensorProto.INT32, ["b"]),
            helper.make_tensor_value_info("tot", TensorProto.INT32, []),
        ],
        [f("y", None), f("ok", None), f("ov", None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", OPSET),
            helper.make_opsetid("com.microsoft", MS_OPSET),
        ],
        ir_version=IR_VERSION,
    )
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _reference(q, keys, values, past, window):
    """Causal (optionally windowed) attention in float64; q [S, N, H], keys [T, KV, H]."""
    out = np.zeros((q.shape[0], N, H))
    for s in range(q.shape[0]):
        pos = past + s
        lo = 0 if window < 0 else max(0, pos - window + 1)
        for n in range(N):
            kv = n // (N // KV)
            scores = keys[lo : pos + 1, kv] @ q[s, n]
            p = np.exp(scores - scores.max())
            out[s, n] = (p / p.sum()) @ values[lo : pos + 1, kv]
    return out.reshape(q.shape[0], N * H)


def _bind(session, feeds, past_k, past_v, shared: bool):
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))
    binding.bind_ortvalue_input("pk", past_k)
    binding.bind_ortvalue_input("pv", past_v)
    binding.bind_output("y", "cpu")
    if shared:
        binding.bind_ortvalue_output("ok", past_k)
        binding.bind_ortvalue_output("ov", past_v)
    else:
        binding.bind_output("ok", "cpu")
        binding.bind_output("ov", "cpu")
    session.run_with_iobinding(binding)
    return [v.numpy() for v in binding.get_outputs()]


@pytest.mark.parametrize("window", [-1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_shared_buffer_equals_concat_and_numpy(window, dtype):
    from onnx import TensorProto

    elem = TensorProto.FLOAT if dtype is np.float32 else TensorProto.FLOAT16
    session = _session(window, elem)
    rng = np.random.default_rng(0)
    total = STEPS[-1][0] + STEPS[-1][1]
    keys, values, queries = (rng.standard_normal((total, h, H)) for h in (KV, KV, N))
    keys, values, queries = (a.astype(dtype).astype(np.float64) for a in (keys, values, queries))
    tol = 1e-5 if dtype is np.float32 else 5e-3
    buf_k = ort.OrtValue.ortvalue_from_numpy(np.zeros((B, KV, M, H), dtype))
    buf_v = ort.OrtValue.ortvalue_from_numpy(np.zeros((B, KV, M, H), dtype))
    past_k = past_v = np.zeros((B, KV, 0, H), dtype)
    empty = np.zeros((B, 0, KV * H), dtype)
    for past, new in STEPS:
        want = _reference(queries[past : past + new], keys, values, past, window)
        feeds = {
            "q": queries[past : past + new].reshape(B, new, N * H).astype(dtype),
            "k": keys[past : past + new].reshape(B, new, KV * H).astype(dtype),
            "v": values[past : past + new].reshape(B, new, KV * H).astype(dtype),
            "sk": np.array([past + new - 1], np.int32),  # attention_mask of length P + S
            "tot": np.array(past + new, np.int32),
        }
        concat = _bind(
            session,
            feeds,
            ort.OrtValue.ortvalue_from_numpy(past_k),
            ort.OrtValue.ortvalue_from_numpy(past_v),
            shared=False,
        )
        past_k, past_v = concat[1], concat[2]
        assert past_k.shape == (B, KV, past + new, H)  # concat: present grows every step
        shared = _bind(session, feeds, buf_k, buf_v, shared=True)
        assert shared[1].shape == (B, KV, M, H)  # shared: present *is* the M-long buffer
        np.testing.assert_array_equal(shared[0], concat[0])
        np.testing.assert_allclose(concat[0][0].astype(np.float64), want, atol=tol, rtol=tol)
        np.testing.assert_array_equal(buf_k.numpy()[:, :, : past + new], past_k)
        assert not buf_k.numpy()[:, :, past + new :].any()  # rows past P + S untouched

        # a KV consumer: empty K/V, the producer's M-long buffer as its past
        consumer = {**feeds, "k": empty, "v": empty}
        out = _bind(session, consumer, buf_k, buf_v, shared=False)
        np.testing.assert_array_equal(out[0], shared[0])
