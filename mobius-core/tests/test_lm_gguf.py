"""mobius.lm.gguf: the llama.cpp config keys and tensor names of Llama-shaped decoders,
and the per-layer names a family adds (``layer_tensors``)."""

from __future__ import annotations

import pytest

from mobius.errors import CheckpointError
from mobius.lm.gguf import LAYER_TENSORS, decoder_translation

META = {
    "toy.block_count": 1,
    "toy.embedding_length": 8,
    "toy.feed_forward_length": 16,
    "toy.attention.head_count": 2,
    "toy.attention.head_count_kv": 1,
    "toy.rope.freq_base": 10000.0,
}
TENSORS = {
    "token_embd.weight": (32, 8),
    "blk.0.attn_q.weight": (8, 8),
    "blk.0.ffn_gate_inp.weight": (4, 8),
}


def _translate(**kw):
    return decoder_translation(
        META, TENSORS, architecture="toy", model_type="toy", hf_class="ToyForCausalLM",
        permuted_qk=False, **kw,
    )  # fmt: skip


def test_config_and_names():
    t = _translate()
    assert t.config["num_hidden_layers"] == 1 and t.config["num_key_value_heads"] == 1
    assert t.config["vocab_size"] == 32 and t.config["tie_word_embeddings"] is True
    assert t.config["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    assert t.tensors["blk.0.attn_q.weight"] == "model.layers.0.self_attn.q_proj.weight"
    # a name outside the layer names is left out: the opener refuses the file naming it
    assert "blk.0.ffn_gate_inp.weight" not in t.tensors


def test_family_layer_names():
    t = _translate(layer_tensors={**LAYER_TENSORS, "ffn_gate_inp": "mlp.gate"})
    assert t.tensors["blk.0.ffn_gate_inp.weight"] == "model.layers.0.mlp.gate.weight"
    assert t.tensors["blk.0.attn_q.weight"] == "model.layers.0.self_attn.q_proj.weight"


def test_missing_keys_named():
    with pytest.raises(CheckpointError, match=r"toy\.feed_forward_length"):
        decoder_translation(
            {k: v for k, v in META.items() if "feed_forward" not in k}, TENSORS,
            architecture="toy", model_type="toy", hf_class="T", permuted_qk=False,
        )  # fmt: skip
