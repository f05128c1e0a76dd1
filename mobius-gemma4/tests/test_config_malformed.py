"""Malformed config.json values: each is a ConfigError naming its key path, never a crash.

The cases are the ones the config fuzzer (test_fuzz_gemma_config.py) found escaping as
TypeError / AttributeError / ValueError / ZeroDivisionError, looping on a huge layer
count, or being accepted although wrong (negative PLE width, NaN eps, string eos ids).
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from reference.paths import CONFIGS

from mobius import config_fields as cf
from mobius.errors import ConfigError
from mobius_gemma4.audio.config import read_audio_config
from mobius_gemma4.config import FULL, SLIDING, read_config, read_text_config
from mobius_gemma4.vision.config import read_vision_config

pytestmark = pytest.mark.l1  # config reading is the first stage of a build

TINY = json.loads((CONFIGS / "tiny-hubstyle.json").read_text())


def _expect(fn: Any, *args: Any, where: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        fn(*args)
    assert where in (err.value.where or ""), err.value.render()
    assert err.value.fix
    return err.value


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ({"rope_parameters": {"sliding_attention": 1}}, "rope_parameters.sliding_attention"),
        (
            {"rope_parameters": {"full_attention": {"rope_theta": "x"}}},
            "text_config.rope_parameters.full_attention.rope_theta",
        ),
        (
            {"rope_parameters": {"full_attention": {"partial_rotary_factor": []}}},
            "full_attention.partial_rotary_factor",
        ),
        (
            {"rope_parameters": {"full_attention": {"partial_rotary_factor": 2.0}}},
            "full_attention.partial_rotary_factor",
        ),
        ({"rope_parameters": 5}, "text_config.rope_parameters"),
        ({"rms_norm_eps": []}, "text_config.rms_norm_eps"),
        ({"rms_norm_eps": math.nan}, "text_config.rms_norm_eps"),
        ({"rms_norm_eps": -1e-6}, "text_config.rms_norm_eps"),
        ({"final_logit_softcapping": []}, "text_config.final_logit_softcapping"),
        ({"final_logit_softcapping": math.inf}, "text_config.final_logit_softcapping"),
        ({"eos_token_id": "x"}, "text_config.eos_token_id"),
        ({"eos_token_id": {}}, "text_config.eos_token_id"),
        ({"eos_token_id": ["x"]}, "text_config.eos_token_id[0]"),
        ({"eos_token_id": [1, -2]}, "text_config.eos_token_id[1]"),
        ({"hidden_size_per_layer_input": "x"}, "text_config.hidden_size_per_layer_input"),
        ({"hidden_size_per_layer_input": [1]}, "text_config.hidden_size_per_layer_input"),
        ({"hidden_size_per_layer_input": -5}, "text_config.hidden_size_per_layer_input"),
        ({"layer_types": 5}, "text_config.layer_types"),
        ({"layer_types": [SLIDING] * 5 + [7]}, "text_config.layer_types[5]"),
        ({"hidden_size": True}, "text_config.hidden_size"),
        ({"num_attention_heads": 4.0}, "text_config.num_attention_heads"),
        ({"attention_k_eq_v": "yes"}, "text_config.attention_k_eq_v"),
        ({"per_layer_config": {"x": {}}}, "text_config.per_layer_config.x"),
        ({"per_layer_config": {"2": {"head_dim": "big"}}}, "per_layer_config.2.head_dim"),
        ({"global_head_dim": []}, "text_config.global_head_dim"),
        ({"hidden_activation": 3}, "text_config.hidden_activation"),
    ],
)
def test_bad_text_values_name_their_key(patch: dict, where: str) -> None:
    raw = copy.deepcopy(TINY)
    raw["text_config"].update(patch)
    _expect(read_config, "gemma4", raw, where=where)


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (2, "config.json"),
        ({"text_config": [None]}, "config.json.text_config"),
        ({"text_config": [{"a": 1}]}, "config.json.text_config"),
        ({"vision_config": [1]}, "config.json.vision_config"),
        ({"image_token_id": "x"}, "config.json.image_token_id"),
        ({"image_token_id": 2**40}, "config.json.image_token_id"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ],
)
def test_bad_top_level_values_are_config_errors(raw: Any, where: str) -> None:
    _expect(read_config, "gemma4", raw, where=where)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_hidden_layers", 2**31),
        ("num_hidden_layers", cf.MAX_LAYERS + 1),
        ("vocab_size", 2**62),
        ("hidden_size", 2**64),
        ("head_dim", 2**40),
        ("num_attention_heads", 10**6),
        ("num_kv_shared_layers", 2**62),
    ],
)
def test_absurd_sizes_are_refused_quickly(key: str, value: int) -> None:
    raw = {"num_hidden_layers": 6, key: value}
    err = _expect(read_text_config, raw, where=f"config.json.{key}")
    assert "limit" in err.what or "num_kv_shared_layers" in err.what


def test_bounds_are_generous_for_real_sizes() -> None:
    t = read_text_config({"num_hidden_layers": cf.MAX_LAYERS, "vocab_size": cf.MAX_VOCAB})
    assert t.num_hidden_layers == cf.MAX_LAYERS and len(t.layer_types) == cf.MAX_LAYERS
    assert t.vocab_size == cf.MAX_VOCAB


def test_valid_spellings_still_read() -> None:
    t = read_text_config(
        {
            "num_hidden_layers": 2,
            "layer_types": [SLIDING, FULL],
            "eos_token_id": 7,
            "rope_parameters": {"sliding_attention": {"rope_theta": 10000}},  # int theta
            "final_logit_softcapping": None,
            "per_layer_config": None,
        }
    )
    assert t.eos_token_id == (7,) and t.final_logit_softcapping is None
    assert t.rope_parameters[SLIDING].rope_theta == 10000.0
    assert read_text_config({"eos_token_id": None}).eos_token_id == ()
    assert read_text_config({}).eos_token_id == (1,)
    cfg = read_config("gemma4", {"image_token_id": None})
    assert cfg.image_token_id is None and cfg.video_token_id == 258_884


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"rope_parameters": 5}, "rope_parameters"),
        ({"rope_parameters": {"rope_theta": "x"}}, "rope_parameters.rope_theta"),
        ({"hidden_size": {}}, "hidden_size"),
        ({"num_attention_heads": []}, "num_attention_heads"),
        ({"intermediate_size": {}}, "intermediate_size"),
        ({"patch_size": []}, "patch_size"),
        ({"pooling_kernel_size": {}}, "pooling_kernel_size"),
        ({"position_embedding_size": []}, "position_embedding_size"),
        ({"rms_norm_eps": {}}, "rms_norm_eps"),
        ({"head_dim": "x"}, "head_dim"),
        ({"head_dim": None, "num_attention_heads": 64}, "head_dim"),
        ({"num_hidden_layers": 2**62}, "num_hidden_layers"),
        ({"standardize": "true"}, "standardize"),
    ],
)
def test_bad_vision_values_name_their_key(patch: dict, key: str) -> None:
    raw = {**TINY["vision_config"], **patch}
    _expect(read_vision_config, raw, where=f"vision_config.{key}")


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"subsampling_conv_channels": 5}, "subsampling_conv_channels"),
        ({"subsampling_conv_channels": [128, "x"]}, "subsampling_conv_channels[1]"),
        ({"attention_chunk_size": []}, "attention_chunk_size"),
        ({"attention_context_left": {}}, "attention_context_left"),
        ({"attention_context_left": 0}, "attention_context_left"),
        ({"attention_context_right": "x"}, "attention_context_right"),
        ({"attention_logit_cap": []}, "attention_logit_cap"),
        ({"attention_invalid_logits_value": "x"}, "attention_invalid_logits_value"),
        ({"rms_norm_eps": {}}, "rms_norm_eps"),
        ({"output_proj_dims": []}, "output_proj_dims"),
        ({"hidden_size": 2**62}, "hidden_size"),
    ],
)
def test_bad_audio_values_name_their_key(patch: dict, key: str) -> None:
    raw = {**TINY["audio_config"], **patch}
    _expect(read_audio_config, raw, where=f"audio_config.{key}")


def test_where_is_not_doubled_when_callers_name_the_section() -> None:
    raw = {**TINY["vision_config"], "hidden_size": "x"}
    with pytest.raises(ConfigError) as err:
        read_vision_config(raw, where="config.json: vision_config")
    assert err.value.where == "config.json: vision_config.hidden_size"
