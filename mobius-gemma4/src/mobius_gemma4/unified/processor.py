"""Gemma 4 unified preprocessing in numpy (docs/gemma4.md §7; HF ``Gemma4UnifiedImageProcessor``
and ``Gemma4UnifiedAudioFeatureExtractor``).

Images: RGB → the aspect-preserving resize of Gemma 4 (sides multiples of 48 within
``max_soft_tokens · 9`` 16-px patches; :func:`mobius_gemma4.vision.processor.resize_to_budget`)
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
from mobius_gemma4.vision.processor import (
    check_positions,
    check_soft_tokens,
    patch_grid,
    process_images,
    resize_to_budget,
)

SAMPLES_PER_TOKEN = 640
IMAGE_WHERE = "Gemma 4 unified image processor"


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


class UnifiedImageProcessor:
    """Images → ``pixel_values`` / ``pixel_position_ids`` of 48-px merged patches."""

    def __init__(
        self,
        *,
        patch_size: int = 16,
        pooling_kernel_size: int = 3,
        max_soft_tokens: int = 280,
        position_embedding_size: int | None = None,
    ) -> None:
        check_soft_tokens(max_soft_tokens, IMAGE_WHERE)
        self.position_embedding_size = position_embedding_size
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
        if resize:
            rgb = resize_to_budget(
                rgb, patch_size=p, max_patches=self.max_soft_tokens * k * k, pooling_kernel_size=k
            )
        h, w = rgb.shape[:2]
        if h % m or w % m:
            raise MobiusError(
                f"image of {h}x{w} pixels is not a whole number of {m}-px patches",
                where=IMAGE_WHERE,
                fix="let the processor resize it (resize=True)",
            )
        n = (h // m) * (w // m)
        check_positions(
            w // m,
            h // m,
            self.position_embedding_size,
            "vision_config.mm_posemb_size",
            IMAGE_WHERE,
        )
        if n > self.max_soft_tokens:
            raise MobiusError(
                f"image of {h}x{w} pixels gives {n} patches, over max_soft_tokens "
                f"{self.max_soft_tokens}",
                where=IMAGE_WHERE,
                fix="pass a smaller image or raise max_soft_tokens",
            )
        return patch_grid(rgb, m, self.max_soft_tokens)

    def __call__(self, images: Sequence[Any]) -> UnifiedImageBatch:
        """Process a list of images (paths, bytes, PIL images or uint8 arrays)."""
        pixel_values, positions, tokens = process_images(images, self.patchify, IMAGE_WHERE)
        return UnifiedImageBatch(
            pixel_values=pixel_values, pixel_position_ids=positions, num_soft_tokens=tokens
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
