"""mobius.images: RGB loading and the patch-budget resize any family's processor uses."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mobius.errors import MediaError, MobiusError
from mobius.images import MAX_IMAGE_PIXELS, load_rgb, resize_to_budget, target_size


def test_arrays_become_rgb():
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4)
    rgb = load_rgb(grey)
    assert rgb.shape == (3, 4, 3) and (rgb[..., 2] == grey).all()
    rgba = np.zeros((2, 2, 4), dtype=np.uint8)
    rgba[..., 3] = 255
    assert load_rgb(rgba).shape == (2, 2, 3) and not load_rgb(rgba).any()


def test_wrong_arrays_are_refused():
    with pytest.raises(MobiusError, match="dtype float32, expected uint8"):
        load_rgb(np.zeros((2, 2, 3), dtype=np.float32))
    with pytest.raises(MobiusError, match=r"shape \(2, 2, 2\)"):
        load_rgb(np.zeros((2, 2, 2), dtype=np.uint8))
    with pytest.raises(MobiusError, match="cannot use a int as an image"):
        load_rgb(3)


def test_encoded_bytes_decode_and_corrupt_bytes_name_the_input():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (5, 3), (10, 20, 30)).save(buf, format="PNG")
    rgb = load_rgb(buf.getvalue())
    assert rgb.shape == (3, 5, 3) and tuple(rgb[0, 0]) == (10, 20, 30)
    with pytest.raises(MediaError, match=r"^cannot decode image: ") as err:
        load_rgb(b"not an image")
    assert err.value.where == "image bytes"


def test_oversized_array_is_refused_before_copying():
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    big = np.broadcast_to(np.zeros((1, 1, 3), dtype=np.uint8), (side, side, 3))
    with pytest.raises(MediaError, match="over the limit"):
        load_rgb(big)


def test_budget_resize_keeps_aspect_and_multiples():
    kw = {"patch_size": 16, "max_patches": 2520, "pooling_kernel_size": 3}
    assert target_size(768, 768, **kw) == (768, 768)
    h, w = target_size(300, 500, **kw)
    assert h % 48 == 0 and w % 48 == 0 and (h // 16) * (w // 16) <= 2520
    rgb = np.zeros((768, 768, 3), dtype=np.uint8)
    assert resize_to_budget(rgb, **kw) is rgb  # already there: not resampled
    assert resize_to_budget(np.zeros((300, 500, 3), dtype=np.uint8), **kw).shape == (h, w, 3)
