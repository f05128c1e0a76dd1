"""Reading gemma3_text config.json: HF 5.24 defaults, layer pattern, ropes, clear errors."""

from __future__ import annotations

import pytest

from mobius.errors import ConfigError
from mobius_gemma3.config import read_config

FULL, SLIDING = "full_attention", "sliding_attention"


def test_defaults_follow_gemma3_text_config():
    cfg = read_config("gemma3_text", {})
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim) == (2304, 26, 256)
    assert (cfg.vocab_size, cfg.num_key_value_heads, cfg.intermediate_size) == (262208, 4, 9216)
    assert cfg.tie_word_embeddings and cfg.hidden_act == "gelu_tanh"
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (2, (1,), 0)
    assert cfg.sliding_window == 4096 and cfg.query_pre_attn_scalar == 256
    # every 6th layer is global (HF's default sliding_window_pattern)
    assert [i for i, t in enumerate(cfg.layer_types) if t == FULL] == [5, 11, 17, 23]
    assert (cfg.rope.rope_theta, cfg.local_rope.rope_theta) == (1e6, 1e4)
    assert cfg.final_logit_softcapping is None and cfg.qk_norm


def test_rope_scaling_applies_to_global_layers_only():
    cfg = read_config(
        "gemma3_text",
        {"rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    )
    assert (cfg.rope.rope_type, cfg.rope.factor, cfg.rope.rope_theta) == ("linear", 8.0, 5e5)
    assert (cfg.local_rope.rope_type, cfg.local_rope.rope_theta) == ("default", 1e4)


def test_saved_shape_rope_parameters_per_layer_type():
    raw = {
        "rope_parameters": {
            FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 123.0},
            SLIDING: {"rope_type": "default", "rope_theta": 45.0},
        }
    }
    cfg = read_config("gemma3_text", raw)
    assert (cfg.rope.rope_type, cfg.rope.factor, cfg.rope.rope_theta) == ("linear", 2.0, 123.0)
    assert cfg.local_rope.rope_theta == 45.0


def test_window_null_makes_every_layer_full():
    cfg = read_config("gemma3_text", {"num_hidden_layers": 4, "sliding_window": None})
    assert cfg.sliding_window is None and set(cfg.layer_types) == {FULL}


def test_hidden_act_is_ignored_as_in_hf():
    cfg = read_config("gemma3_text", {"hidden_act": "not-an-activation"})
    assert cfg.hidden_act == "gelu_tanh"


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"num_hidden_layers": 2, "layer_types": [FULL]}, "layer_types"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope_parameters"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling"),
        ({"hidden_activation": "relu"}, "hidden_activation"),
        ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
        ({"final_logit_softcapping": -1.0}, "final_logit_softcapping"),
        ({"sliding_window": 0}, "sliding_window"),
    ],
)
def test_bad_values_are_one_line_errors(raw, key):
    with pytest.raises(ConfigError) as err:
        read_config("gemma3_text", raw)
    assert key in str(err.value) and err.value.fix
