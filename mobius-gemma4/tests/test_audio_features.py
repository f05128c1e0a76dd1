"""Gemma 4 audio feature extractor: frame arithmetic, resampling, agreement with HF 5.24."""

from __future__ import annotations

import numpy as np
import pytest

from mobius_gemma4.audio.features import Gemma4AudioFeatureExtractor, load_audio, resample

DURATIONS = [0.3, 1.0, 1.2, 3.7, 10.0]


def _clip(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = round(seconds * 16000)
    t = np.arange(n) / 16000
    tone = 0.3 * np.sin(2 * np.pi * (200 + 100 * seed) * t)
    return (tone + 0.05 * rng.standard_normal(n)).astype(np.float32)


@pytest.mark.l1
def test_frame_counts_and_tokens() -> None:
    fe = Gemma4AudioFeatureExtractor()
    batch = fe([_clip(1.0, 0)])
    assert batch.input_features.shape == (1, 99, 128)  # (16000 + 160 − 321) // 160 + 1
    assert batch.input_features_mask.dtype == np.bool_
    assert int(batch.input_features_mask.sum()) == 99
    assert batch.num_soft_tokens == (25,)
    two = fe([_clip(1.0, 0), _clip(0.3, 1)])  # padded to the longest; the short one masked
    assert two.input_features.shape == (2, 99, 128)
    assert int(two.input_features_mask[1].sum()) == (4800 + 160 - 321) // 160 + 1
    assert (two.input_features[1, ~two.input_features_mask[1]] == 0).all()


@pytest.mark.l1
def test_resample_keeps_a_tone() -> None:
    sr = 44_100
    t = np.arange(sr) / sr
    x = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    y = resample(x, sr)
    assert len(y) == 16_000
    ref = np.sin(2 * np.pi * 440 * np.arange(16_000) / 16_000)
    assert np.abs(y[200:-200] - ref[200:-200]).max() < 1e-3  # edges see zero padding
    assert np.array_equal(load_audio(x, sampling_rate=16_000), x)


@pytest.mark.l1
def test_wav_roundtrip(tmp_path) -> None:
    sf = pytest.importorskip("soundfile")
    x = _clip(0.5, 1)
    path = tmp_path / "a.wav"
    sf.write(str(path), x, 16_000, subtype="FLOAT")
    np.testing.assert_array_equal(load_audio(path), x)


@pytest.mark.reference
@pytest.mark.l3
def test_matches_hf_feature_extractor() -> None:
    pytest.importorskip("transformers")
    from transformers.models.gemma4.feature_extraction_gemma4 import (
        Gemma4AudioFeatureExtractor as HF,
    )

    clips = [_clip(d, i) for i, d in enumerate(DURATIONS)]
    hf_fe, fe = HF(), Gemma4AudioFeatureExtractor()
    for clip in clips:  # one at a time
        h = hf_fe([clip], return_tensors="np")
        o = fe([clip])
        assert o.input_features.shape == h["input_features"].shape
        np.testing.assert_array_equal(o.input_features_mask, h["input_features_mask"])
        assert np.abs(o.input_features - h["input_features"]).max() <= 1e-5
    h = hf_fe(clips, return_tensors="np")  # a batch of unequal lengths
    o = fe(clips)
    np.testing.assert_array_equal(o.input_features_mask, h["input_features_mask"])
    diff = float(np.abs(o.input_features - h["input_features"]).max())
    print(f"audio features vs HF: max|Δ| = {diff:.3g}")
    assert diff <= 1e-5
    want_tokens = [int(m[::2][::2].sum()) for m in h["input_features_mask"]]
    assert list(o.num_soft_tokens) == want_tokens
