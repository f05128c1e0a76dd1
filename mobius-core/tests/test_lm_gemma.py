"""mobius.lm.gemma and the Gemma-generic components (ScaledEmbedding, embed_scale,
logit_softcap): the rules they pin. Their numerics against HF are mobius-gemma3's L3."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mobius.components import embed_scale
from mobius.lm.config import FULL, SLIDING, GemmaConfig, RopeParams, read_decoder

DEFAULTS = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def _cfg(**kw) -> GemmaConfig:
    fields = read_decoder("toy_gemma", {}, "config.json", family="Toy", defaults=DEFAULTS)
    fields.update(hidden_act="gelu_tanh", tie_word_embeddings=kw.pop("tied", True))
    return GemmaConfig(
        **fields,
        layer_types=(SLIDING, SLIDING, FULL),
        sliding_window=4,
        query_pre_attn_scalar=kw.pop("scalar", 24.0),
        local_rope=RopeParams("default", 10_000.0),
        final_logit_softcapping=kw.pop("cap", None),
        attn_logit_softcapping=kw.pop("attn_cap", None),
        qk_norm=kw.pop("qk_norm", True),
    )


def test_embed_scale_is_rounded_to_the_table_dtype():
    # HF's comment: sqrt(3072) = 55.4256 becomes 55.5 in bfloat16
    assert embed_scale(3072, "bfloat16") == 55.5
    assert embed_scale(3072, "float16") == float(np.float16(np.sqrt(np.float32(3072))))
    assert embed_scale(3072) == float(np.sqrt(np.float32(3072)))


def _nodes(model, op_type):
    return [n for n in model.graph if n.op_type == op_type]


@pytest.mark.parametrize("target", ["default", "cpu"])
def test_gemma_graph_pins_scale_caps_and_two_ropes(target):
    from mobius.lm.gemma import build_gemma

    model = build_gemma(_cfg(cap=30.0, attn_cap=50.0), "f32", target, family="toy")
    cores = _nodes(model, "Attention") + _nodes(model, "GroupQueryAttention")
    assert len(cores) == 3
    for node in cores:
        assert node.attributes["scale"].as_float() == pytest.approx(24.0**-0.5)
        assert node.attributes["softcap"].as_float() == 50.0
    assert len(_nodes(model, "Tanh")) == 1  # the final logit cap
    ropes = {n for n in model.graph.initializers if n.endswith("inv_freq")}
    assert ropes == {"rope.inv_freq", "rope_local.inv_freq"}


def test_without_caps_there_is_no_tanh_and_no_softcap_attribute():
    from mobius.lm.gemma import build_gemma

    model = build_gemma(_cfg(qk_norm=False), "f32", family="toy")
    assert not _nodes(model, "Tanh")
    assert all("softcap" not in n.attributes for n in _nodes(model, "Attention"))
    assert not any("q_norm" in n for n in model.graph.initializers)


@pytest.mark.parametrize("tied", [True, False])
def test_gemma_plan_matches_the_graph(tmp_path, tied):
    from mobius.lm.gemma import build_gemma, gemma_plan

    cfg = _cfg(tied=tied)
    model = build_gemma(cfg, "f32", family="toy")
    wanted = {n for n, v in model.graph.initializers.items() if v.const_value is None}
    assert {"layers.2.pre_feedforward_layernorm.weight", "layers.0.self_attn.k_norm.weight"} <= (
        wanted
    )
    names = {f"model.{n}" for n in wanted} | {"lm_head.weight"}
    plan = gemma_plan(cfg, SimpleNamespace(tensors=names, root=tmp_path), "float32")
    assert set(plan.entries) == wanted


def test_scaled_embedding_and_softcap_compute_what_they_say():
    ort = pytest.importorskip("onnxruntime")
    from mobius.components import ScaledEmbedding, logit_softcap
    from mobius.lm.ports import build_graph

    table = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    emb = ScaledEmbedding(4, 3, 2.5)

    def forward(op, ins):
        return {"y": logit_softcap(op, emb(op, ins["ids"]), 4.0)}

    model = build_graph("t", [("ids", "int64", ("n",))], [("y", "float32", ("n", 3))], forward)
    import onnx_ir as ir

    model.graph.initializers["weight"].const_value = ir.tensor(table)
    proto = ir.to_proto(model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([2, 0], dtype=np.int64)
    (got,) = sess.run(None, {"ids": ids})
    np.testing.assert_allclose(got, 4.0 * np.tanh(table[ids] * 2.5 / 4.0), rtol=1e-6)
