"""Config reading: both JSON shapes, HF 5.24 defaults, rejections, the variant table of docs/gemma4.md §1."""

from __future__ import annotations

import json

import pytest
from reference.paths import CONFIGS

from mobius.errors import ConfigError
from mobius_gemma4.config import FULL, SLIDING, read_config, read_text_config

pytestmark = pytest.mark.l1  # config reading is the first stage of a build


def _load(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def test_hub_and_per_layer_shapes_resolve_identically():
    hub = read_config("gemma4", _load("tiny-hubstyle.json"))
    per_layer = read_config("gemma4", _load("tiny-perlayer.json"))
    assert hub.text == per_layer.text
    assert hub.placeholder_token_ids == per_layer.placeholder_token_ids
    t = hub.text
    assert t.layer_types == (SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL)
    assert t.head_dims == (16, 16, 32, 16, 16, 32)
    assert t.kv_heads == (2,) * 6
    assert t.num_cache_layers == 4 and t.kv_producer(4) == 3 and t.kv_producer(5) == 2
    assert [t.mlp_width(i) for i in range(6)] == [128] * 4 + [256] * 2


def test_missing_keys_take_hf_524_defaults():
    t = read_text_config({})
    assert t.hidden_size_per_layer_input == 256 and t.vocab_size_per_layer_input == 262144
    assert t.num_hidden_layers == 30 and t.sliding_window == 512
    assert t.layer_types[5] == FULL and t.layer_types[0] == SLIDING and t.layer_types[-1] == FULL
    assert t.head_dims[5] == 512 and t.head_dims[0] == 256  # global_head_dim default 512
    assert t.kv_heads == (4,) * 30  # no num_global_key_value_heads -> num_key_value_heads
    assert t.final_logit_softcapping is None and not t.attention_k_eq_v
    assert t.rope_parameters[FULL].rope_type == "proportional"
    assert t.rope_parameters[FULL].partial_rotary_factor == 0.25


def test_ple_off_when_zero_or_null():
    assert not read_text_config({"hidden_size_per_layer_input": 0}).has_ple
    assert not read_text_config({"hidden_size_per_layer_input": None}).has_ple


def test_global_kv_heads_only_with_k_eq_v():
    base = {"num_hidden_layers": 6, "num_key_value_heads": 4, "num_global_key_value_heads": 1}
    assert read_text_config(base).kv_heads[5] == 4
    assert read_text_config({**base, "attention_k_eq_v": True}).kv_heads[5] == 1


def test_last_layer_forced_full():
    t = read_text_config({"num_hidden_layers": 2, "layer_types": [SLIDING, SLIDING]})
    assert t.layer_types == (SLIDING, FULL)


def test_bidirectional_all_rejected_vision_accepted():
    with pytest.raises(ConfigError, match="'all'") as err:
        read_text_config({"use_bidirectional_attention": "all"})
    assert err.value.where and err.value.fix
    assert (
        read_text_config({"use_bidirectional_attention": "vision"}).use_bidirectional_attention
        == "vision"
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"layer_types": ["sliding_attention", "bogus"], "num_hidden_layers": 2},
        {"num_hidden_layers": 3, "layer_types": [FULL]},
        {"num_kv_shared_layers": 30},
        {"hidden_activation": "silu"},
        {"enable_moe_block": True},
        {"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}},
        {"num_attention_heads": 6, "num_key_value_heads": 4},
        {"hidden_size": -3},
    ],
)
def test_invalid_values_raise_config_error(bad):
    with pytest.raises(ConfigError):
        read_text_config(bad)


def test_unknown_model_type_rejected():
    with pytest.raises(ConfigError, match="gemma4_unified"):
        read_config("gemma4_unified", {})


# name: (H, L, inter, heads, hd sliding, hd full, kvh sliding, kvh full, k_eq_v, W, N_sh, double, D_ple, moe)
VARIANTS = {
    "gemma-4-E2B-it.json": (1536, 35, 6144, 8, 256, 512, 1, 1, False, 512, 20, True, 256, None),
    "gemma-4-E4B-it.json": (2560, 42, 10240, 8, 256, 512, 2, 2, False, 512, 18, False, 256, None),
    "gemma-4-12B-it.json": (3840, 48, 15360, 16, 256, 512, 8, 1, True, 1024, 0, False, 0, None),
    "gemma-4-26B-A4B-it.json": (
        2816,
        30,
        2112,
        16,
        256,
        512,
        8,
        2,
        True,
        1024,
        0,
        False,
        0,
        (128, 8, 704),
    ),
    "gemma-4-31B-it.json": (5376, 60, 21504, 32, 256, 512, 16, 4, True, 1024, 0, False, 0, None),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_full_size_configs_match_variant_table(name):
    raw = _load(name)
    t = read_text_config(raw["text_config"])
    H, L, inter, nh, hds, hdf, kvs, kvf, keqv, W, nsh, dbl, ple, moe = VARIANTS[name]
    assert (t.hidden_size, t.num_hidden_layers, t.intermediate_size, t.num_attention_heads) == (
        H,
        L,
        inter,
        nh,
    )
    assert t.layer_type_dim(SLIDING) == hds and t.layer_type_dim(FULL) == hdf
    kv_by_type = {
        typ: {t.kv_heads[i] for i in range(L) if t.layer_types[i] == typ} for typ in (SLIDING, FULL)
    }
    assert kv_by_type == {SLIDING: {kvs}, FULL: {kvf}}
    assert (t.attention_k_eq_v, t.sliding_window, t.num_kv_shared_layers) == (keqv, W, nsh)
    assert (t.use_double_wide_mlp, t.hidden_size_per_layer_input) == (dbl, ple)
    assert t.final_logit_softcapping == 30.0 and t.tie_word_embeddings
    period = 5 if name == "gemma-4-E2B-it.json" else 6
    assert [i for i in range(L) if t.layer_types[i] == FULL] == list(range(period - 1, L, period))
    if moe:
        assert (t.num_experts, t.top_k_experts, t.moe_intermediate_size) == moe
    else:
        assert not t.enable_moe_block
