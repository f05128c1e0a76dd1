"""Reading Qwen3 / Qwen3-MoE config.json: HF 5.24 defaults, both shapes, clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TESTDATA

from mobius.errors import ConfigError
from mobius_qwen3.config import FULL, SLIDING, read_config

CONFIGS = TESTDATA / "configs"


def _raw(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def test_real_configs():
    small = read_config("qwen3", _raw("Qwen3-0.6B.json"))
    assert (small.hidden_size, small.num_key_value_heads, small.head_dim) == (1024, 8, 128)
    assert small.tie_word_embeddings and not small.is_moe
    assert small.rope.rope_type == "default" and small.rope.rope_theta == 1e6
    assert small.layer_types == (FULL,) * 28 and small.sliding_window is None
    moe = read_config("qwen3_moe", _raw("Qwen3-30B-A3B.json"))
    assert moe.sparse_layers == (True,) * 48
    assert (moe.num_experts, moe.num_experts_per_tok, moe.norm_topk_prob) == (128, 8, True)


def test_defaults_follow_each_model_type():
    """Absent keys take HF 5.24's per-class defaults (they differ between the two)."""
    dense = read_config("qwen3", {"model_type": "qwen3"})
    assert (dense.hidden_size, dense.num_hidden_layers, dense.head_dim) == (4096, 32, 128)
    assert dense.num_key_value_heads == 32 and dense.rope.rope_theta == 10_000.0
    moe = read_config("qwen3_moe", {"model_type": "qwen3_moe"})
    assert (moe.hidden_size, moe.num_key_value_heads, moe.head_dim) == (2048, 4, 64)
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (128, 8, 768)
    assert moe.norm_topk_prob is False


def test_both_rope_shapes_resolve_identically():
    hub = {
        "rope_theta": 5e5,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    }
    saved = {
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 5e5,
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        }
    }
    a = read_config("qwen3", {"model_type": "qwen3", **hub})
    b = read_config("qwen3", {"model_type": "qwen3", **saved})
    assert a.rope == b.rope and a.rope.rope_type == "yarn"
    # save_pretrained's MoE shape: num_local_experts instead of num_experts
    c = read_config("qwen3_moe", {"num_local_experts": 16})
    assert c.num_experts == 16


def test_sparse_layers_and_windows():
    moe = read_config(
        "qwen3_moe",
        {"num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]},
    )
    assert moe.sparse_layers == (False, True, False, False, False, True)
    dense = read_config(
        "qwen3",
        {
            "num_hidden_layers": 4,
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": 2,
        },
    )
    assert dense.layer_types == (FULL, FULL, SLIDING, SLIDING) and dense.window(3) == 8
    off = read_config(
        "qwen3", {"num_hidden_layers": 2, "sliding_window": 8, "layer_types": [SLIDING, FULL]}
    )
    assert off.layer_types == (FULL, FULL) and off.sliding_window is None


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"hidden_size": "big"}, "hidden_size"),
        ({"num_key_value_heads": 3, "num_attention_heads": 8}, "multiple"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
        ({"rope_scaling": {"type": "linear"}}, "factor"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"layer_types": ["full_attention"], "num_hidden_layers": 2}, "layer_types"),
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"head_dim": 7}, "odd"),
    ],
)
def test_bad_values_name_the_key(raw, words):
    with pytest.raises(ConfigError) as err:
        read_config("qwen3", raw)
    text = f"{err.value} {err.value.where} {err.value.fix}"
    assert words in text and err.value.fix


def test_moe_top_k_bounded():
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        read_config("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 8})


@pytest.mark.reference
@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default", "rope_theta": 1e6},
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.5},
        {
            "rope_type": "yarn",
            "rope_theta": 1e6,
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
        {
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 8.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 16,
            "beta_slow": 2,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
        },
        {
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 2.0,
            "attention_factor": 1.3,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
        {
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
def test_rope_inv_freq_equals_hf(params):
    """mobius.components.rope_inv_freq (through the Qwen3 reader) vs HF 5.24's own."""
    pytest.importorskip("torch")
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mobius.components import rope_inv_freq

    raw = {
        "head_dim": 64,
        "num_attention_heads": 4,
        "hidden_size": 256,
        "max_position_embeddings": 131072,
        "rope_parameters": dict(params),
    }
    cfg = read_config("qwen3", raw)
    ours, scaling = rope_inv_freq(cfg.rope.as_dict(), 64, 131072)
    hf_cfg = Qwen3Config(**raw)
    kind = params["rope_type"]
    if kind == "default":
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        theirs, hf_scaling = Qwen3RotaryEmbedding.compute_default_rope_parameters(hf_cfg)
    else:
        theirs, hf_scaling = ROPE_INIT_FUNCTIONS[kind](hf_cfg, "cpu")
    np.testing.assert_array_equal(ours, theirs.numpy())
    assert scaling == pytest.approx(hf_scaling, rel=1e-12)
