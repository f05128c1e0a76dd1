"""L1 (no torch): reading ``gemma4_unified`` configs and the numpy unified processors."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from reference.paths import CONFIGS

from mobius.errors import ConfigError
from mobius.records import BuildOptions
from mobius_gemma4.plugin import mobius_model_types, mobius_processors, mobius_read_config
from mobius_gemma4.unified.processor import UnifiedAudioFrames, UnifiedImageProcessor

pytestmark = pytest.mark.l1

CONFIG_12B = CONFIGS / "gemma-4-12B-it.json"


def _raw() -> dict:
    return json.loads(CONFIG_12B.read_text())


def test_12b_reads_as_unified_without_ple():
    assert "gemma4_unified" in {m.model_type for m in mobius_model_types()}
    config = mobius_read_config("gemma4_unified", _raw())
    text = config.text
    assert config.model_type == "gemma4_unified"
    assert not text.has_ple and not text.enable_moe_block
    assert text.use_bidirectional_attention == "vision"
    assert text.kv_heads[:6] == (8, 8, 8, 8, 8, 1) and text.head_dims[5] == 512
    assert text.num_cache_layers == 48 and text.sliding_window == 1024
    v, a = config.vision, config.audio
    assert (v.patch_dim, v.mm_embed_dim, v.mm_posemb_size, v.num_soft_tokens) == (
        6912,
        3840,
        1120,
        280,
    )
    assert a.audio_embed_dim == 640


def test_unified_text_defaults_differ_from_gemma4():
    """Gemma4UnifiedTextConfig: window 1024, 262144 positions, "vision" when absent."""
    raw = _raw()
    for key in ("sliding_window", "max_position_embeddings", "use_bidirectional_attention"):
        raw["text_config"].pop(key)
    text = mobius_read_config("gemma4_unified", raw).text
    assert text.sliding_window == 1024
    assert text.max_position_embeddings == 262_144
    assert text.use_bidirectional_attention == "vision"


@pytest.mark.parametrize(
    ("part", "key", "value", "match"),
    [
        ("vision_config", "output_proj_dims", 1024, "mm_embed_dim"),
        ("vision_config", "model_patch_size", 32, "patch_size"),
        ("audio_config", "output_proj_dims", 320, "audio_embed_dim"),
        ("vision_config", "mm_embed_dim", "big", "integer"),
    ],
)
def test_bad_embedder_configs_are_config_errors(part, key, value, match):
    raw = copy.deepcopy(_raw())
    raw[part][key] = value
    with pytest.raises(ConfigError, match=match):
        mobius_read_config("gemma4_unified", raw)


def test_absent_media_configs_drop_the_encoders():
    from mobius_gemma4.contract import text_components

    raw = _raw()
    raw.pop("audio_config")
    raw["vision_config"] = None
    config = mobius_read_config("gemma4_unified", raw)
    assert text_components(config, BuildOptions()) == ("embedding", "decoder")


def test_processors_emit_48px_patches_and_640_sample_frames():
    config = mobius_read_config("gemma4_unified", _raw())
    procs = mobius_processors(config)
    image = np.random.default_rng(0).integers(0, 256, size=(200, 300, 3), dtype=np.uint8)
    out = procs.preprocess_image([image])
    assert out["pixel_values"].shape == (1, 280, 6912)
    n = out["num_soft_tokens"][0]
    assert (out["pixel_position_ids"][0, :n] >= 0).all()
    assert (out["pixel_position_ids"][0, n:] == -1).all()
    audio = procs.preprocess_audio([np.ones(1_000, dtype=np.float32)])
    assert audio["input_features"].shape == (1, 2, 640)
    assert audio["num_soft_tokens"] == [2]
    # stop ids are the checkpoint's own eos ids (the real 12B config lists [1, 106])
    assert set(procs.stop_token_ids) >= {1, 106}


def test_patch_layout_is_hwc_row_major():
    rgb = np.arange(96 * 144 * 3, dtype=np.int64).reshape(96, 144, 3) % 256
    patches, pos, n = UnifiedImageProcessor(max_soft_tokens=70).patchify(
        rgb.astype(np.uint8), resize=False
    )
    assert n == 6 and pos[:n].tolist() == [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]]
    expect = rgb[48:96, 48:96].astype(np.float32).reshape(-1) / 255.0  # patch (x=1, y=1)
    np.testing.assert_allclose(patches[4], expect, atol=1e-7)


def test_audio_frames_pad_tail_and_batch():
    batch = UnifiedAudioFrames()([np.ones(1_300, np.float32), np.ones(640, np.float32)])
    assert batch.input_features.shape == (2, 3, 640)
    assert batch.input_features_mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.input_features[0, 2, 19] == 1.0 and batch.input_features[0, 2, 20] == 0.0
    assert batch.num_soft_tokens == (3, 1)
