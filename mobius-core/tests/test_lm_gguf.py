"""mobius.lm.gguf: the llama.cpp config keys and tensor names of Llama-shaped decoders,
and the per-layer names a family adds (``hf_tensor_name(name, layer_tensors)``)."""

from __future__ import annotations

import pytest

from mobius.errors import CheckpointError
from mobius.lm.gguf import LAYER_TENSORS, decoder_translation, hf_tensor_name

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


def _translate():
    return decoder_translation(
        META, TENSORS, architecture="toy", model_type="toy", hf_class="ToyForCausalLM",
        permuted_qk=False,
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
    names = {**LAYER_TENSORS, "ffn_gate_inp": "mlp.gate"}
    assert hf_tensor_name("blk.0.ffn_gate_inp.weight", names) == "model.layers.0.mlp.gate.weight"
    assert hf_tensor_name("blk.3.attn_q.bias", names) == "model.layers.3.self_attn.q_proj.bias"
    for odd in ("blk.0.ffn_gate_inp.weight", "blk.x.attn_q.weight", "blk.0.attn_q.scale",
                "token_embd.bias", "blk.0.attn_q"):  # fmt: skip
        assert hf_tensor_name(odd) is None, odd


def test_missing_keys_named():
    with pytest.raises(CheckpointError, match=r"toy\.feed_forward_length"):
        decoder_translation(
            {k: v for k, v in META.items() if "feed_forward" not in k}, TENSORS,
            architecture="toy", model_type="toy", hf_class="T", permuted_qk=False,
        )  # fmt: skip
