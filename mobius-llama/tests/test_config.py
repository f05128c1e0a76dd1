"""Reading Llama / Mistral config.json: HF 5.24 defaults, windows, biases, clear errors."""

from __future__ import annotations

import pytest

from mobius.errors import ConfigError
from mobius_llama.config import read_config


def test_defaults_follow_each_model_type():
    llama = read_config("llama", {})
    assert (llama.hidden_size, llama.intermediate_size, llama.num_key_value_heads) == (
        4096,
        11008,
        32,
    )
    assert llama.max_position_embeddings == 2048 and llama.sliding_window is None
    assert (llama.bos_token_id, llama.eos_token_id) == (1, (2,))
    mistral = read_config("mistral", {})
    assert (mistral.intermediate_size, mistral.num_key_value_heads) == (14336, 8)
    # MistralConfig's default window is 4096; every layer slides
    assert mistral.sliding_window == 4096 and mistral.window(31) == 4096


def test_mistral_window_null_is_full_causal():
    cfg = read_config("mistral", {"num_hidden_layers": 2, "sliding_window": None})
    assert cfg.sliding_window is None and cfg.window(1) is None


def test_biases_as_each_hf_class_reads_them():
    raw = {"attention_bias": True, "mlp_bias": True}
    llama = read_config("llama", raw)
    assert llama.attention_bias and llama.mlp_bias
    mistral = read_config("mistral", raw)  # MistralAttention / MistralMLP have no biases
    assert not mistral.attention_bias and not mistral.mlp_bias


def test_head_dim_may_differ_from_hidden_over_heads():
    cfg = read_config("llama", {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32})
    assert cfg.head_dim == 32
    assert read_config("llama", {"hidden_size": 64, "num_attention_heads": 4}).head_dim == 16


@pytest.mark.parametrize(
    ("model_type", "raw", "words"),
    [
        ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
        ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ("llama", {"num_attention_heads": 8, "num_key_value_heads": 3}, "multiple"),
        ("mistral", {"sliding_window": 0}, "sliding_window"),
        ("mistral", {"hidden_act": "relu"}, "hidden_act"),
    ],
)
def test_bad_values_name_the_key(model_type, raw, words):
    with pytest.raises(ConfigError) as err:
        read_config(model_type, raw)
    assert words in f"{err.value} {err.value.where}" and err.value.fix
