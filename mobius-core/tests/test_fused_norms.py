"""``--target cpu`` float32 RMSNorms as onnxruntime's fused norm ops.

The component (``RMSNorm(fused=True)``, ``RMSNorm.residual``) against numpy, and the
decoder kit's graphs (Llama-shaped with q/k norms, Gemma's sandwich norms and ``1 + w``):
a cpu build holds the fused ops and none of the chain's ReduceMean / Sqrt / Reciprocal,
its logits equal those of the same build with the chain (and of the default-target build)
within a few float32 ulps of the logits' scale, and the greedy ids are equal. Every other
target and dtype keeps the chain.

Tolerance: onnxruntime's kernels divide by ``sqrt(mean(x²) + eps)`` where the chain
multiplies by its reciprocal, and sum ``x²`` in their own order: each norm's output differs
in the last bit or two (relative 1e-7). Through the tiny two/three-layer models below the
logits move by at most 6e-7 of the largest |logit| (measured, fused vs chain and fused vs
the default build, whose attention op also differs: ONNX Attention vs
GroupQueryAttention); :data:`TOL`, 2e-5, leaves 30x for other CPUs' vector widths.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from mobius.components import (
    RMSNorm,
    add_input,
    add_output,
    finish_model,
    fused_rmsnorm_available,
    new_graph,
)
from mobius.lm.config import FULL, SLIDING, DecoderConfig, GemmaConfig, RopeParams, read_decoder

ort = pytest.importorskip("onnxruntime")

CHAIN = {"ReduceMean", "Sqrt", "Reciprocal"}
FUSED = {"RMSNormalization", "SkipSimplifiedLayerNormalization"}
TOL = 2e-5
"""Largest |Δ logits| allowed, relative to the largest |logit| (module docstring)."""

DEFAULTS = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def _session(model: ir.Model):
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)  # RMSNormalization is standard ONNX
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _rms_ref(x, w, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize(("with_weight", "offset"), [(True, 0.0), (True, 1.0), (False, 0.0)])
def test_fused_rmsnorm_and_residual_match_numpy(with_weight, offset):
    graph, _, op = new_graph("norm")
    x = add_input(op, "x", "float32", ("batch", "seq", 16))
    d = add_input(op, "d", "float32", ("batch", "seq", 16))
    norm = RMSNorm(16, 1e-6, with_weight, weight_offset=offset, fused=True, name="norm")
    add_output(op, norm(op, x), "y")
    y2, s = norm.residual(op, x, d)
    add_output(op, y2, "y2")
    add_output(op, s, "s")
    rng = np.random.default_rng(1)
    w = (rng.standard_normal(16) * 0.3).astype(np.float32)
    if with_weight:
        norm.weight.const_value = ir.tensor(w)
        assert [p.name for p in norm.parameters()] == ["norm.weight"]
    model = finish_model(graph)
    ops = Counter(n.op_type for n in model.graph)
    assert ops["RMSNormalization"] == 1 and ops["SkipSimplifiedLayerNormalization"] == 1
    assert not CHAIN & set(ops)
    assert ops["Add"] == (2 if offset else 0)  # the only Adds: offset + w, once per node
    xv = (rng.standard_normal((2, 3, 16)) * 3).astype(np.float32)
    dv = (rng.standard_normal((2, 3, 16)) * 3).astype(np.float32)
    y, y2v, sv = _session(model).run(None, {"x": xv, "d": dv})
    scale = (offset + w) if with_weight else 1.0
    np.testing.assert_allclose(y, _rms_ref(xv, scale, 1e-6), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sv, xv + dv)
    np.testing.assert_allclose(y2v, _rms_ref(xv + dv, scale, 1e-6), rtol=1e-5, atol=1e-5)


def test_fused_only_for_cpu_float32():
    assert fused_rmsnorm_available("cpu", "float32")
    for target, dtype in [("cpu", "float16"), ("cpu", "bfloat16"), ("default", "float32")]:
        assert not fused_rmsnorm_available(target, dtype)
    assert not fused_rmsnorm_available("cuda", "float16")


def _llama_cfg() -> DecoderConfig:
    raw = {"num_hidden_layers": 2, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
    fields = read_decoder("toy", raw, "config.json", family="Toy", defaults=DEFAULTS)
    return DecoderConfig(**fields, layer_types=(FULL, FULL), sliding_window=None)


def _gemma_cfg() -> GemmaConfig:
    raw = {"num_hidden_layers": 3}
    fields = read_decoder("toy_gemma", raw, "config.json", family="Toy", defaults=DEFAULTS)
    fields.update(hidden_act="gelu_tanh", tie_word_embeddings=False)
    return GemmaConfig(
        **fields,
        layer_types=(SLIDING, SLIDING, FULL),
        sliding_window=4,
        query_pre_attn_scalar=16.0,
        local_rope=RopeParams("default", 10_000.0),
        final_logit_softcapping=30.0,
        attn_logit_softcapping=None,
        qk_norm=True,
    )


def _build(kind: str, target: str, dtype: str = "f32", logits: str = "all") -> ir.Model:
    from mobius.lm.decoder import build_decoder
    from mobius.lm.gemma import build_gemma

    if kind == "llama":
        return build_decoder(_llama_cfg(), dtype, target, family="toy", qk_norm=True, logits=logits)
    return build_gemma(_gemma_cfg(), dtype, target, family="toy", logits=logits)


def _norm_count(kind: str) -> int:
    """RMSNorms in the graph: per layer 2 (+2 q/k) for llama, 4 (+2) for Gemma; + the head's."""
    return 2 * (2 + 2) + 1 if kind == "llama" else 3 * (4 + 2) + 1


def _fill(model: ir.Model, seed: int = 0) -> ir.Model:
    """Random weights (the same for every build: by name), norm weights near 1."""
    for name in sorted(model.graph.initializers):
        v = model.graph.initializers[name]
        if v.const_value is not None:
            continue
        rng = np.random.default_rng([seed, *name.encode()])
        shape = [int(d) for d in v.shape]
        w = rng.standard_normal(shape) * (0.1 if "norm" in name else 0.3)
        if "norm" in name and "gemma" not in model.graph.name:
            w = w + 1.0
        v.const_value = ir.tensor(w.astype(np.float32))
    return model


def _greedy(session, prompt: list[int], new: int) -> tuple[list[int], np.ndarray]:
    inputs = session.get_inputs()
    kv = [i for i in inputs if i.name.startswith("past_key_values.")]
    outs = [o.name for o in session.get_outputs()]
    past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in kv}
    step, total, ids, rows = np.array([prompt], np.int64), 0, [], []
    for _ in range(new):
        n = step.shape[1]
        values = dict(
            zip(
                outs,
                session.run(
                    None,
                    {
                        "input_ids": step,
                        "attention_mask": np.ones((1, total + n), np.int64),
                        "position_ids": np.arange(total, total + n, dtype=np.int64)[None],
                        **past,
                    },
                ),
            )
        )
        rows.append(values["logits"][0])  # the prefill's every row, then one per step
        ids.append(int(np.argmax(values["logits"][0, -1])))
        past = {i.name: values[i.name.replace("past_key_values.", "present.")] for i in kv}
        total += n
        step = np.array([[ids[-1]]], np.int64)
    return ids, np.concatenate(rows)


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_cpu_build_fuses_every_norm_and_keeps_the_logits(kind, monkeypatch):
    import mobius.lm.decoder as decoder

    cpu = _build(kind, "cpu")
    ops = Counter(n.op_type for n in cpu.graph)
    assert sum(ops[o] for o in FUSED) == _norm_count(kind), ops
    assert not CHAIN & set(ops), ops
    # every residual add is inside a SkipSimplifiedLayerNormalization: 2 per layer
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * (2 if kind == "llama" else 3)
    # left Adds: Gemma's 1 + w on each norm weight (constant: onnxruntime folds them)
    assert ops["Add"] == (0 if kind == "llama" else _norm_count(kind))

    monkeypatch.setattr(decoder, "fused_rmsnorm_available", lambda target, dtype: False)
    chain = _build(kind, "cpu")
    monkeypatch.undo()
    assert not FUSED & {n.op_type for n in chain.graph}
    default = _build(kind, "default")

    prompt = [3, 14, 15, 9, 26, 5, 35]
    got = {
        name: _greedy(_session(_fill(model)), prompt, 6)
        for name, model in {"cpu": cpu, "chain": chain, "default": default}.items()
    }
    ids, logits = got["cpu"]
    scale = float(np.abs(got["chain"][1]).max())
    assert ids == got["chain"][0] == got["default"][0]
    assert float(np.abs(logits - got["chain"][1]).max()) <= TOL * scale
    assert float(np.abs(logits - got["default"][1]).max()) <= TOL * scale


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_last_position_cpu_build_adds_the_last_residual_before_the_head(kind):
    """``logits="last"``: the final residual is sliced with the stream and added by the
    head's norm; the logits equal the all-positions build's last row."""
    last, full = _fill(_build(kind, "cpu", logits="last")), _fill(_build(kind, "cpu"))
    assert not CHAIN & {n.op_type for n in last.graph}
    prompt = [7, 1, 22, 40]
    ids_last, rows_last = _greedy(_session(last), prompt, 3)
    ids_full, rows_full = _greedy(_session(full), prompt, 3)
    assert ids_last == ids_full
    np.testing.assert_array_equal(rows_last[0], rows_full[len(prompt) - 1])


@pytest.mark.parametrize("kind", ["llama", "gemma"])
@pytest.mark.parametrize(("target", "dtype"), [("default", "f32"), ("cuda", "f16"), ("cpu", "f16")])
def test_other_targets_and_dtypes_keep_the_chain(kind, target, dtype):
    ops = Counter(n.op_type for n in _build(kind, target, dtype).graph)
    assert not FUSED & set(ops)
    assert ops["ReduceMean"] == ops["Reciprocal"] == _norm_count(kind)
