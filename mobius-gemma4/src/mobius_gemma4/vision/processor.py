"""Gemma 4 image preprocessing in numpy (docs/gemma4.md §5.1; HF ``Gemma4ImageProcessorPil``).

RGB decode → aspect-preserving resize to the patch budget (sides multiples of
``pooling_kernel_size · patch_size``) → rescale by 1/255 (no normalisation: the
model applies ``2·(p − 0.5)``) → channels-last patchify → (x, y) positions →
padding to ``max_soft_tokens · k²`` patches with zero pixels and (−1, −1).

Decoding (refusals of hostile input included) and the resize to the patch budget are
core's :mod:`mobius.images`: Pillow's bicubic filter on the 8-bit image, exactly what HF's
PIL backend does, so patches match it bit for bit; HF's default torchvision backend
resizes in float with its own antialias kernel and differs by a few 1/255 steps. An
image whose patch grid is wider or taller than the vision position table is refused
here (HF's processor makes the same positions; its model then fails with an index
error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mobius.errors import MediaError, MobiusError
from mobius.images import MAX_IMAGE_PIXELS, load_rgb, resize_to_budget

SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)
"""``max_soft_tokens`` values Gemma 4 was trained with (HF refuses others)."""
WHERE = "Gemma 4 image processor"


@dataclass(frozen=True)
class ImageBatch:
    """Encoder inputs for a list of images, plus the soft-token count of each."""

    pixel_values: np.ndarray  # float32 [n_images, max_patches, 3·p²]
    pixel_position_ids: np.ndarray  # int64 [n_images, max_patches, 2], (−1, −1) = padding
    num_soft_tokens: tuple[int, ...]  # per image; sum = rows of image_features


def check_positions(n_cols: int, n_rows: int, table: int | None, what: str, where: str) -> None:
    """Refuse a patch grid whose x or y position has no row in the model's position table."""
    if table is not None and max(n_cols, n_rows) > table:
        raise MediaError(
            f"image is {n_cols}x{n_rows} patches after resizing, but the model's position "
            f"table ({what}) has {table} entries per axis",
            where=where,
            fix=f"pass an image whose long side is at most {table} times its short side",
        )


def patch_grid(rgb: np.ndarray, side: int, rows: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Rescaled ``side``-px patches of ``rgb`` padded to ``rows``: ``(patches, positions, n)``.

    Pixels are rescaled by 1/255 (float64, then float32, as HF does); each patch is
    flattened (row, column, channel), patches go row-major with positions (x = column,
    y = row); rows past the ``n`` real patches hold zero pixels and (−1, −1). The
    caller ensures the sides are multiples of ``side`` and ``n <= rows``.
    """
    h, w = rgb.shape[:2]
    ph, pw = h // side, w // side
    n = ph * pw
    pixels = (rgb.astype(np.float64) * (1.0 / 255.0)).astype(np.float32)
    # [H, W, C] -> [ph, s, pw, s, C] -> [ph, pw, s, s, C]: row, column, channel inside a patch.
    patches = pixels.reshape(ph, side, pw, side, 3).transpose(0, 2, 1, 3, 4).reshape(n, -1)
    xs, ys = np.meshgrid(np.arange(pw), np.arange(ph), indexing="xy")
    positions = np.stack([xs, ys], axis=-1).reshape(n, 2).astype(np.int64)
    out_p = np.zeros((rows, 3 * side * side), dtype=np.float32)
    out_pos = np.full((rows, 2), -1, dtype=np.int64)
    out_p[:n], out_pos[:n] = patches, positions
    return out_p, out_pos, n


def check_soft_tokens(max_soft_tokens: int, where: str) -> None:
    """Refuse a ``max_soft_tokens`` budget Gemma 4 was not trained with (HF refuses it too)."""
    if max_soft_tokens not in SUPPORTED_SOFT_TOKENS:
        raise MobiusError(
            f"max_soft_tokens {max_soft_tokens} is not supported",
            where=where,
            fix=f"use one of {SUPPORTED_SOFT_TOKENS}",
        )


def process_images(
    images: Sequence[Any],
    patchify: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, int]],
    where: str,
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Decode and ``patchify`` each image; stacked ``(pixel_values, positions, tokens)``.

    A single image (not in a list) is accepted as a list of one.
    """
    if not isinstance(images, Sequence) or isinstance(images, (str, bytes)):
        images = [images]
    try:
        done = [patchify(load_rgb(im)) for im in images]
    except MemoryError as e:
        raise MediaError(
            "not enough memory to decode and resize the image(s)",
            where=where,
            fix=f"pass fewer or smaller images (each at most {MAX_IMAGE_PIXELS:,} pixels)",
        ) from e
    if not done:
        raise MobiusError("no images to process", where=where, fix="pass at least one image")
    return (
        np.stack([d[0] for d in done]),
        np.stack([d[1] for d in done]),
        tuple(d[2] for d in done),
    )


class Gemma4ImageProcessor:
    """Turns images into ``pixel_values`` / ``pixel_position_ids`` for ``vision_encoder``."""

    def __init__(
        self,
        *,
        patch_size: int = 16,
        pooling_kernel_size: int = 3,
        max_soft_tokens: int = 280,
        position_embedding_size: int | None = None,
    ) -> None:
        check_soft_tokens(max_soft_tokens, WHERE)
        self.position_embedding_size = position_embedding_size
        self.patch_size = patch_size
        self.pooling_kernel_size = pooling_kernel_size
        self.max_soft_tokens = max_soft_tokens
        self.max_patches = max_soft_tokens * pooling_kernel_size**2

    def patchify(self, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """One decoded image → ``(patches [max_patches, 3p²], positions [max_patches, 2], tokens)``."""
        p, k = self.patch_size, self.pooling_kernel_size
        rgb = resize_to_budget(
            rgb, patch_size=p, max_patches=self.max_patches, pooling_kernel_size=k
        )
        check_positions(
            rgb.shape[1] // p,
            rgb.shape[0] // p,
            self.position_embedding_size,
            "vision_config.position_embedding_size",
            WHERE,
        )
        out_p, out_pos, n = patch_grid(rgb, p, self.max_patches)
        return out_p, out_pos, n // k**2

    def __call__(self, images: Sequence[Any]) -> ImageBatch:
        """Process a list of images (paths, bytes, PIL images or uint8 arrays)."""
        pixel_values, positions, tokens = process_images(images, self.patchify, WHERE)
        return ImageBatch(
            pixel_values=pixel_values, pixel_position_ids=positions, num_soft_tokens=tokens
        )
