"""Gemma 4 unified preprocessing in numpy (reference §7; HF ``Gemma4UnifiedImageProcessor``
and ``Gemma4UnifiedAudioFeatureExtractor``).

Images: RGB → the aspect-preserving resize of Gemma 4 (sides multiples of 48 within
``max_soft_tokens · 9`` 16-px patches; :func:`mobius_gemma4.vision.processor.target_size`)
→ rescale by 1/255 (no normalisation) → 48×48 merged patches, each flattened (row, column,
channel), patches row-major with positions (x = column, y = row) → padded to
``max_soft_tokens`` rows with zero pixels and (−1, −1). HF patchifies at 16 px and then
merges 3×3 groups in kernel order; the result is exactly the 48-px patchification done
here. One soft token per merged patch.

Audio: each 16 kHz clip is zero-padded to a multiple of 640 samples and cut into 640-sample
(40 ms) frames, one soft token each; the batch is right-padded with zero frames and the
mask marks the real ones.

Resizing uses Pillow's bicubic filter on the 8-bit image (HF's PIL-backend behaviour, as
the ``gemma4`` processor does); HF's default torchvision backend resizes in float and may
differ by a few 1/255 steps. Images that need no resize match HF exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mobius.errors import MobiusError
from mobius_gemma4.vision.processor import SUPPORTED_SOFT_TOKENS, load_rgb, target_size

SAMPLES_PER_TOKEN = 640


@dataclass(frozen=True)
class UnifiedImageBatch:
    """Inputs of the unified ``vision_encoder`` for a list of images."""

    pixel_values: np.ndarray  # float32 [n_images, max_soft_tokens, 48·48·3]
    pixel_position_ids: np.ndarray  # int64 [n_images, max_soft_tokens, 2], (−1, −1) = padding
    num_soft_tokens: tuple[int, ...]  # valid merged patches per image


@dataclass(frozen=True)
class UnifiedAudioBatch:
    """Inputs of the unified ``audio_encoder`` for a list of clips."""

    input_features: np.ndarray  # float32 [batch, frames, 640] raw samples
    input_features_mask: np.ndarray  # bool [batch, frames]
    num_soft_tokens: tuple[int, ...]  # real frames per clip


def _resize(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    from PIL import Image

    pil = Image.fromarray(rgb, mode="RGB")
    return np.asarray(pil.resize((width, height), resample=Image.BICUBIC, reducing_gap=None))


class UnifiedImageProcessor:
    """Images → ``pixel_values`` / ``pixel_position_ids`` of 48-px merged patches."""

    def __init__(
        self, *, patch_size: int = 16, pooling_kernel_size: int = 3, max_soft_tokens: int = 280
    ) -> None:
        if max_soft_tokens not in SUPPORTED_SOFT_TOKENS:
            raise MobiusError(
                f"max_soft_tokens {max_soft_tokens} is not supported",
                where="Gemma 4 unified image processor",
                fix=f"use one of {SUPPORTED_SOFT_TOKENS}",
            )
        self.patch_size = patch_size
        self.pooling_kernel_size = pooling_kernel_size
        self.max_soft_tokens = max_soft_tokens

    @property
    def model_patch_size(self) -> int:
        return self.patch_size * self.pooling_kernel_size

    def patchify(self, rgb: np.ndarray, *, resize: bool = True):
        """One RGB image → ``(patches [max_soft_tokens, 3·m²], positions, tokens)``.

        ``resize=False`` patchifies at the native size (sides must be multiples of 48).
        """
        p, k, m = self.patch_size, self.pooling_kernel_size, self.model_patch_size
        h, w = rgb.shape[:2]
        if resize:
            th, tw = target_size(
                h, w, patch_size=p, max_patches=self.max_soft_tokens * k * k, pooling_kernel_size=k
            )
            if (th, tw) != (h, w):
                rgb = _resize(rgb, th, tw)
                h, w = th, tw
        if h % m or w % m:
            raise MobiusError(
                f"image of {h}x{w} pixels is not a whole number of {m}-px patches",
                where="Gemma 4 unified image processor",
                fix="let the processor resize it (resize=True)",
            )
        ph, pw = h // m, w // m
        n = ph * pw
        if n > self.max_soft_tokens:
            raise MobiusError(
                f"image of {h}x{w} pixels gives {n} patches, over max_soft_tokens "
                f"{self.max_soft_tokens}",
                where="Gemma 4 unified image processor",
                fix="pass a smaller image or raise max_soft_tokens",
            )
        pixels = (rgb.astype(np.float64) * (1.0 / 255.0)).astype(np.float32)
        patches = pixels.reshape(ph, m, pw, m, 3).transpose(0, 2, 1, 3, 4).reshape(n, -1)
        xs, ys = np.meshgrid(np.arange(pw), np.arange(ph), indexing="xy")
        positions = np.stack([xs, ys], axis=-1).reshape(n, 2).astype(np.int64)
        out_p = np.zeros((self.max_soft_tokens, 3 * m * m), dtype=np.float32)
        out_pos = np.full((self.max_soft_tokens, 2), -1, dtype=np.int64)
        out_p[:n], out_pos[:n] = patches, positions
        return out_p, out_pos, n

    def __call__(self, images: Sequence[Any]) -> UnifiedImageBatch:
        """Process a list of images (paths, bytes, PIL images or uint8 arrays)."""
        if not isinstance(images, Sequence) or isinstance(images, (str, bytes)):
            images = [images]
        done = [self.patchify(load_rgb(im)) for im in images]
        if not done:
            raise MobiusError(
                "no images to process",
                where="Gemma 4 unified image processor",
                fix="pass at least one image",
            )
        return UnifiedImageBatch(
            pixel_values=np.stack([d[0] for d in done]),
            pixel_position_ids=np.stack([d[1] for d in done]),
            num_soft_tokens=tuple(d[2] for d in done),
        )


class UnifiedAudioFrames:
    """16 kHz clips → ``input_features [B, frames, 640]`` + mask (one token per frame)."""

    def __init__(self, samples_per_token: int = SAMPLES_PER_TOKEN) -> None:
        self.samples_per_token = samples_per_token

    def frames(self, wave: np.ndarray) -> np.ndarray:
        """One 1-D clip → ``[ceil(n / s), s]`` frames, the tail zero-padded."""
        s = self.samples_per_token
        wave = np.asarray(wave, dtype=np.float32).reshape(-1)
        if wave.size == 0:
            raise MobiusError(
                "audio clip has no samples",
                where="Gemma 4 unified audio frames",
                fix="pass a non-empty clip",
            )
        wave = np.pad(wave, (0, (-wave.size) % s))
        return wave.reshape(-1, s)

    def __call__(self, clips: Sequence[np.ndarray]) -> UnifiedAudioBatch:
        """Frame every clip (16 kHz mono float arrays) and right-pad the batch."""
        if isinstance(clips, np.ndarray) and clips.ndim == 1:
            clips = [clips]
        framed = [self.frames(c) for c in clips]
        if not framed:
            raise MobiusError(
                "no audio clips to process",
                where="Gemma 4 unified audio frames",
                fix="pass at least one clip",
            )
        longest = max(len(f) for f in framed)
        feats = np.zeros((len(framed), longest, self.samples_per_token), dtype=np.float32)
        mask = np.zeros((len(framed), longest), dtype=np.bool_)
        for i, f in enumerate(framed):
            feats[i, : len(f)] = f
            mask[i, : len(f)] = True
        return UnifiedAudioBatch(feats, mask, tuple(len(f) for f in framed))


def unified_image_preprocessor(patch_size: int, pooling_kernel_size: int, max_soft_tokens: int):
    """``images → {pixel_values, pixel_position_ids, num_soft_tokens}`` (mobius_processors)."""

    def preprocess_image(images: Sequence[Any]) -> dict[str, Any]:
        proc = UnifiedImageProcessor(  # here, so a bad budget fails only image requests
            patch_size=patch_size,
            pooling_kernel_size=pooling_kernel_size,
            max_soft_tokens=max_soft_tokens,
        )
        batch = proc(list(images))
        return {
            "pixel_values": batch.pixel_values,
            "pixel_position_ids": batch.pixel_position_ids,
            "num_soft_tokens": list(batch.num_soft_tokens),
        }

    return preprocess_image


def unified_audio_preprocessor(samples_per_token: int):
    """``clips → {input_features, input_features_mask, num_soft_tokens}`` (mobius_processors)."""
    from mobius_gemma4.audio.features import load_audio

    frames = UnifiedAudioFrames(samples_per_token)

    def preprocess_audio(clips: Sequence[Any]) -> dict[str, Any]:
        batch = frames([load_audio(c) for c in clips])
        return {
            "input_features": batch.input_features,
            "input_features_mask": batch.input_features_mask,
            "num_soft_tokens": list(batch.num_soft_tokens),
        }

    return preprocess_audio
