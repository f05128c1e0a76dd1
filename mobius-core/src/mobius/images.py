"""Images that a user gives, for any family's image processor: decoded to 8-bit RGB, and
resized to a patch budget.

Images are untrusted input: a path must be a regular file (:func:`mobius.media.read_media_file`
refuses pipes and devices), an image over :data:`MAX_IMAGE_PIXELS` is refused before it is
decoded or copied (a decompression bomb, or a huge array through the API), and a corrupt or
truncated file is a :class:`~mobius.errors.MediaError` naming it. Pillow is imported only
when an image actually needs decoding or resizing; resizing is Pillow's bicubic filter on
the 8-bit image (what HF's PIL image-processor backends do, so patches match them bit for
bit).
"""

from __future__ import annotations

import io
import math
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from mobius.errors import MediaError, MobiusError
from mobius.media import read_media_file

MAX_IMAGE_PIXELS = 1024 * 1024 * 1024 // 4 // 3
"""Largest image taken (89,478,485 pixels, Pillow's decompression-bomb threshold)."""

WHERE = "image processor"


def load_rgb(image: Any) -> np.ndarray:
    """Decode ``image`` to a ``uint8 [H, W, 3]`` RGB array.

    Accepts a path, encoded bytes, a PIL image, or an ``[H, W]`` / ``[H, W, 3|4]``
    uint8 array (alpha dropped, grey replicated).
    """
    if isinstance(image, np.ndarray):
        arr = image
        if arr.dtype != np.uint8:
            raise MobiusError(
                f"image array has dtype {arr.dtype}, expected uint8",
                where=WHERE,
                fix="pass 8-bit RGB pixels (HWC) or an image file",
            )
        if arr.ndim == 2:
            _check_pixels(arr.shape[0], arr.shape[1], "image array")
            arr = np.repeat(arr[:, :, None], 3, axis=2)
        if arr.ndim != 3 or arr.shape[2] not in (3, 4):
            raise MobiusError(
                f"image array has shape {arr.shape}, expected [H, W, 3]",
                where=WHERE,
                fix="pass channels-last RGB pixels",
            )
        _check_pixels(arr.shape[0], arr.shape[1], "image array")
        return np.ascontiguousarray(arr[:, :, :3])
    if isinstance(image, (str, Path)):
        return _decode(read_media_file(image, "image"), str(image))
    if isinstance(image, (bytes, bytearray)):
        return _decode(bytes(image), "image bytes")
    from PIL import Image

    if isinstance(image, Image.Image):
        _check_pixels(image.height, image.width, "PIL image")
        try:
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
        except (OSError, SyntaxError, ValueError, EOFError, zlib.error) as e:
            raise MediaError(
                f"cannot decode image: {e}", where="PIL image", fix="pass an intact image"
            ) from e
    raise MobiusError(
        f"cannot use a {type(image).__name__} as an image",
        where=WHERE,
        fix="pass a path, bytes, a PIL image or a uint8 array",
    )


def _decode(data: bytes, where: str) -> np.ndarray:
    """Encoded image bytes → ``uint8 [H, W, 3]``; every decoder failure is a MediaError."""
    from PIL import Image

    buffer = io.BytesIO(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            pil = Image.open(buffer)
            _check_pixels(pil.height, pil.width, where)
            return np.asarray(pil.convert("RGB"), dtype=np.uint8)
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise MediaError(
            f"image is too large to decode safely: {e}",
            where=where,
            fix="pass a smaller image",
        ) from e
    except (OSError, SyntaxError, ValueError, EOFError, zlib.error) as e:
        # Pillow names the buffer it read ("<_io.BytesIO object at 0x…>"): name the input
        raise MediaError(
            f"cannot decode image: {str(e).replace(repr(buffer), where)}",
            where=where,
            fix="pass an intact image file (PNG, JPEG, …)",
        ) from e


def _check_pixels(height: int, width: int, where: str) -> None:
    if height * width > MAX_IMAGE_PIXELS:
        raise MediaError(
            f"image of {width}x{height} pixels ({height * width:,}) is over the limit of "
            f"{MAX_IMAGE_PIXELS:,} pixels",
            where=where,
            fix="pass a smaller image (the model resizes every image to a few thousand patches)",
        )


def target_size(
    height: int, width: int, *, patch_size: int, max_patches: int, pooling_kernel_size: int
) -> tuple[int, int]:
    """Largest aspect-preserving ``(h, w)`` within ``max_patches`` with sides multiple of k·p."""
    target_px = max_patches * patch_size**2
    factor = math.sqrt(target_px / (height * width))
    side = pooling_kernel_size * patch_size
    th = math.floor(factor * height / side) * side
    tw = math.floor(factor * width / side) * side
    if th == 0 and tw == 0:
        raise MobiusError(
            f"image of {height}x{width} pixels cannot be resized to a non-empty patch grid",
            where=WHERE,
            fix="pass a larger image",
        )
    max_side = (max_patches // pooling_kernel_size**2) * side
    if th == 0:  # very wide: one row of pooled cells, as long as the aspect allows
        th, tw = side, min(math.floor(width / height) * side, max_side)
    elif tw == 0:  # very tall
        tw, th = side, min(math.floor(height / width) * side, max_side)
    return th, tw


def resize_rgb(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """``rgb`` resized to ``height`` x ``width`` (Pillow bicubic on the 8-bit image)."""
    from PIL import Image

    pil = Image.fromarray(rgb, mode="RGB")
    return np.asarray(pil.resize((width, height), resample=Image.BICUBIC, reducing_gap=None))


def resize_to_budget(
    rgb: np.ndarray, *, patch_size: int, max_patches: int, pooling_kernel_size: int
) -> np.ndarray:
    """``rgb`` resized (bicubic, 8-bit) to its :func:`target_size`; unchanged when already there.

    Gemma 4's budget (its ``gemma4`` and ``gemma4_unified`` processors).
    """
    h, w = rgb.shape[:2]
    th, tw = target_size(
        h,
        w,
        patch_size=patch_size,
        max_patches=max_patches,
        pooling_kernel_size=pooling_kernel_size,
    )
    return rgb if (th, tw) == (h, w) else resize_rgb(rgb, th, tw)
