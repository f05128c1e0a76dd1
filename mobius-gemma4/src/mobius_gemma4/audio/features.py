"""Gemma 4 audio feature extraction in numpy (docs/gemma4.md §6.1; HF ``Gemma4AudioFeatureExtractor``).

16 kHz mono → pad the batch to its longest item (rounded up to 128 samples,
at most 30 s) → semicausal framing (160 zeros on the left, 321-sample windows,
hop 160, first 320 used) → periodic Hann → |rFFT 512| (magnitude, not power) →
128 HTK mel filters 0–8000 Hz → ``log(mel + 1e-3)``; a frame is valid when the
last sample of its window is real audio, and invalid frames are zeroed.

Files are read with soundfile (WAV, FLAC, …; imported only when a path or bytes
are given). Other sample rates are resampled to 16 kHz by windowed-sinc
interpolation in numpy (Kaiser β = 8.6, 32 zero crossings, cut-off at the lower
Nyquist frequency): band-limited, no scipy needed; accurate to about −80 dB.

Clips are untrusted input: a path must be a regular file (:func:`mobius.media.read_media_file`),
a sample rate outside :data:`SAMPLE_RATES` is refused (a header saying 1 Hz would make
resampling 16,000× longer than the clip), and with ``max_samples`` only the part of the clip
the model keeps is decoded and resampled (a 10-minute file costs what 30 s cost).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mobius.errors import MediaError, MobiusError
from mobius.media import read_media_file

SAMPLE_RATE = 16_000
SAMPLE_RATES = (4_000, 768_000)
"""Lowest and highest sample rate accepted (Hz), inclusive."""


@dataclass(frozen=True)
class AudioBatch:
    """Encoder inputs for a list of clips, plus the soft-token count of each."""

    input_features: np.ndarray  # float32 [batch, frames, 128]
    input_features_mask: np.ndarray  # bool [batch, frames]
    num_soft_tokens: tuple[int, ...]  # per clip; sum = rows of audio_features


def hz_to_mel_htk(f: np.ndarray | float) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def mel_to_hz_htk(m: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (np.asarray(m, dtype=np.float64) / 2595.0) - 1.0)


def mel_filters(n_freqs: int, n_mels: int, f_min: float, f_max: float, sr: int) -> np.ndarray:
    """Triangular HTK mel filters ``[n_freqs, n_mels]`` without area normalisation."""
    mels = np.linspace(hz_to_mel_htk(f_min), hz_to_mel_htk(f_max), n_mels + 2)
    edges = mel_to_hz_htk(mels)
    fft_freqs = np.linspace(0, sr // 2, n_freqs)
    widths = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    return np.maximum(0.0, np.minimum(down, up))


def _half_taps(sr_in: int, sr_out: int) -> int:
    """Input samples :func:`resample` reads on each side of an output position."""
    return math.ceil(32 / min(1.0, sr_out / sr_in))


def input_samples_for(n_out: int, sr_in: int, sr_out: int = SAMPLE_RATE) -> int:
    """Input samples that determine the first ``n_out`` outputs of :func:`resample` exactly."""
    if sr_in == sr_out:
        return n_out
    return math.ceil(n_out * sr_in / sr_out) + _half_taps(sr_in, sr_out) + 2


def resample(wave: np.ndarray, sr_in: int, sr_out: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling of a 1-D signal by Kaiser-windowed sinc interpolation."""
    if sr_in == sr_out:
        return wave.astype(np.float32)
    beta = 8.6
    ratio = sr_out / sr_in
    cutoff = min(1.0, ratio)  # of the input Nyquist
    half = _half_taps(sr_in, sr_out)
    n_out = math.ceil(len(wave) * ratio)
    x = np.asarray(wave, dtype=np.float64)
    out = np.empty(n_out, dtype=np.float64)
    taps = np.arange(-half, half + 1)
    step = 4096
    for start in range(0, n_out, step):
        t = np.arange(start, min(start + step, n_out)) / ratio  # positions in input samples
        base = np.floor(t).astype(np.int64)
        idx = base[:, None] + taps[None, :]
        d = t[:, None] - idx
        w = cutoff * np.sinc(cutoff * d) * np.kaiser(2 * half + 1, beta)[None, :]
        w *= np.abs(d) <= half
        valid = (idx >= 0) & (idx < len(x))
        out[start : start + len(t)] = (
            np.where(valid, x[np.clip(idx, 0, len(x) - 1)], 0.0) * w
        ).sum(1)
    return out.astype(np.float32)


def _check_rate(sr: int, where: str) -> None:
    low, high = SAMPLE_RATES
    if not low <= sr <= high:
        raise MediaError(
            f"audio sample rate {sr} Hz is outside {low}–{high} Hz",
            where=where,
            fix="pass a clip recorded at a real audio sample rate (e.g. 16000 or 44100 Hz)",
        )


def _read_file(data: bytes, where: str, max_samples: int | None) -> tuple[np.ndarray, int]:
    """Decode ``data`` (WAV, FLAC, …) to ``([frames, channels] float32, rate)``.

    The rate is checked from the header before anything is decoded, and with
    ``max_samples`` (at 16 kHz) only the frames that resampling needs are read.
    """
    import soundfile

    buffer = io.BytesIO(data)
    try:
        with soundfile.SoundFile(buffer) as f:
            _check_rate(int(f.samplerate), where)
            frames = -1
            if max_samples is not None:
                frames = input_samples_for(max_samples, int(f.samplerate))
            wave = f.read(frames=frames, dtype="float32", always_2d=True)
            return wave, int(f.samplerate)
    except MediaError:
        raise
    except (RuntimeError, OSError, ValueError, EOFError) as e:
        raise MediaError(  # soundfile names the buffer it read: name the input instead
            f"cannot read audio: {str(e).replace(repr(buffer), where)}",
            where=where,
            fix="pass an intact WAV or FLAC file",
        ) from e


def load_audio(
    source: Any, sampling_rate: int | None = None, *, max_samples: int | None = None
) -> np.ndarray:
    """Decode ``source`` (path, bytes, or a 1-D array at ``sampling_rate``) to 16 kHz mono float32.

    ``max_samples``: the model keeps at most that many 16 kHz samples; only the input
    they depend on is decoded and resampled (the first ``max_samples`` outputs are the
    same as resampling the whole clip; the result may run a few samples longer).
    """
    if isinstance(source, np.ndarray):
        wave, sr = source, sampling_rate or SAMPLE_RATE
        _check_rate(int(sr), "audio array")
        if max_samples is not None and wave.ndim >= 1:
            keep = input_samples_for(max_samples, int(sr))
            wave = wave[:keep] if wave.ndim == 1 or wave.shape[1] <= 8 else wave[:, :keep]
    else:
        if isinstance(source, (str, Path)):
            where, data = str(source), read_media_file(source, "audio")
        elif isinstance(source, (bytes, bytearray)):
            where, data = "audio bytes", bytes(source)
        else:
            raise MobiusError(
                f"cannot use a {type(source).__name__} as audio",
                where="Gemma 4 audio feature extractor",
                fix="pass a path, bytes or a 1-D float array",
            )
        wave, sr = _read_file(data, where, max_samples)
        wave = wave.mean(axis=1)
    wave = np.asarray(wave, dtype=np.float32)
    if wave.ndim == 2:
        wave = wave.mean(axis=1 if wave.shape[1] <= 8 else 0)
    if wave.ndim != 1:
        raise MobiusError(
            f"audio array has shape {wave.shape}, expected [samples]",
            where="Gemma 4 audio feature extractor",
            fix="pass mono samples (or [samples, channels])",
        )
    return resample(wave, int(sr))


class Gemma4AudioFeatureExtractor:
    """Turns clips into ``input_features`` / ``input_features_mask`` for ``audio_encoder``."""

    def __init__(
        self,
        *,
        feature_size: int = 128,
        frame_length: int = 320,
        hop_length: int = 160,
        min_frequency: float = 0.0,
        max_frequency: float = 8000.0,
        mel_floor: float = 1e-3,
        pad_to_multiple_of: int = 128,
        max_samples: int = 480_000,
    ) -> None:
        self.frame_length, self.hop_length = frame_length, hop_length
        self.fft_length = 2 ** math.ceil(math.log2(frame_length))
        self.mel_floor = mel_floor
        self.pad_to_multiple_of, self.max_samples = pad_to_multiple_of, max_samples
        n = np.arange(frame_length, dtype=np.float64)
        self.window = (0.5 - 0.5 * np.cos(2 * np.pi * n / frame_length)).astype(np.float32)
        self.filters = mel_filters(
            self.fft_length // 2 + 1, feature_size, min_frequency, max_frequency, SAMPLE_RATE
        )

    def num_frames(self, n_samples: int) -> int:
        return (n_samples + self.frame_length // 2 - (self.frame_length + 1)) // self.hop_length + 1

    @staticmethod
    def soft_tokens(mask: np.ndarray) -> int:
        """Valid encoder frames of one clip: its frame mask decimated twice (``[::2][::2]``)."""
        return int(mask[::2][::2].sum())

    def _spectrogram(self, wave: np.ndarray) -> np.ndarray:
        x = np.pad(wave, (self.frame_length // 2, 0))
        size = self.frame_length + 1
        n = (len(x) - size) // self.hop_length + 1
        if n <= 0:
            return np.zeros((0, self.filters.shape[1]), dtype=np.float32)
        frames = np.lib.stride_tricks.as_strided(
            x, shape=(n, size), strides=(x.strides[0] * self.hop_length, x.strides[0])
        )[:, :-1]
        mag = np.abs(np.fft.rfft(frames * self.window, n=self.fft_length, axis=-1))
        return np.log(mag @ self.filters + self.mel_floor).astype(np.float32)

    def __call__(self, clips: Sequence[np.ndarray]) -> AudioBatch:
        """Features of 16 kHz mono clips (see :func:`load_audio`), padded to the longest."""
        if isinstance(clips, np.ndarray) and clips.ndim == 1:
            clips = [clips]
        waves = [np.asarray(c, dtype=np.float32)[: self.max_samples] for c in clips]
        if not waves or any(w.ndim != 1 or len(w) == 0 for w in waves):
            raise MobiusError(
                "audio clips must be non-empty 1-D sample arrays",
                where="Gemma 4 audio feature extractor",
                fix="decode files with load_audio() first",
            )
        m = self.pad_to_multiple_of
        length = -(-max(len(w) for w in waves) // m) * m
        feats, masks = [], []
        for w in waves:
            padded = np.zeros(length, dtype=np.float32)
            padded[: len(w)] = w
            spec = self._spectrogram(padded)
            ends = np.arange(spec.shape[0]) * self.hop_length + self.frame_length
            real = np.zeros(length + self.frame_length // 2, dtype=bool)
            real[self.frame_length // 2 : self.frame_length // 2 + len(w)] = True
            mask = real[ends]
            feats.append(spec * mask[:, None])
            masks.append(mask)
        mask_arr = np.stack(masks)
        return AudioBatch(
            input_features=np.stack(feats).astype(np.float32),
            input_features_mask=mask_arr,
            num_soft_tokens=tuple(self.soft_tokens(mk) for mk in masks),
        )
