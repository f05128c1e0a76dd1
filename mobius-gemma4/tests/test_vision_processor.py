"""Gemma 4 image processor: budget arithmetic, layout, and agreement with HF 5.24."""

from __future__ import annotations

import numpy as np
import pytest

from mobius.errors import MobiusError
from mobius.images import target_size
from mobius_gemma4.vision.processor import Gemma4ImageProcessor

SIZES = [
    (144, 192),
    (480, 640),
    (1000, 300),
    (37, 1200),
    (20, 2000),
    (5, 900),
    (2000, 12),
    (48, 48),
    (768, 768),
]


@pytest.mark.l1
def test_target_size_examples() -> None:
    kw = {"patch_size": 16, "max_patches": 2520, "pooling_kernel_size": 3}
    assert target_size(768, 768, **kw) == (768, 768)  # 48x48 patches = 2304 <= 2520
    assert target_size(20, 2000, **kw) == (48, 8016)  # thin but regular
    h, w = target_size(5, 2000, **kw)  # degenerate: the short side rounds to 0
    assert h == 48 and w == min(400 * 48, 280 * 48)
    with pytest.raises(MobiusError):
        Gemma4ImageProcessor(max_soft_tokens=100)


@pytest.mark.l1
def test_layout_channels_last_and_positions() -> None:
    img = np.zeros((48, 96, 3), dtype=np.uint8)
    img[:16, 16:32, 1] = 255  # patch (x=1, y=0), green channel
    proc = Gemma4ImageProcessor(max_soft_tokens=70)
    p, pos, tokens = proc.patchify(img)
    # 48x96 is already a multiple of 48 but the budget upscales it; patch grid follows.
    assert tokens * 9 == int((pos[:, 0] >= 0).sum())
    assert (pos[int((pos[:, 0] >= 0).sum()) :] == -1).all()
    assert p.shape == (630, 768) and pos.dtype == np.int64


def _image(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    return base


@pytest.mark.reference
@pytest.mark.l3
@pytest.mark.parametrize("max_soft_tokens", [70, 280])
def test_matches_hf_pil_backend_exactly(max_soft_tokens: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    images = [_image(h, w, i) for i, (h, w) in enumerate(SIZES)]
    hf = Gemma4ImageProcessorPil(max_soft_tokens=max_soft_tokens)(
        [Image.fromarray(im) for im in images], return_tensors="np"
    )
    ours = Gemma4ImageProcessor(max_soft_tokens=max_soft_tokens)(images)
    assert ours.pixel_values.shape == hf["pixel_values"].shape
    assert list(ours.num_soft_tokens) == list(hf["num_soft_tokens_per_image"])
    np.testing.assert_array_equal(ours.pixel_position_ids, hf["image_position_ids"])
    np.testing.assert_array_equal(ours.pixel_values, hf["pixel_values"])


# No comparison with HF's torchvision backend (``Gemma4ImageProcessor``): no env can
# install a torchvision that works with the CPU torch 2.13.0 wheel. torchvision 0.28.0,
# the release paired with torch 2.13.0, exists on PyPI only as a CUDA build; beside
# torch 2.13.0+cpu its import fails ("operator torchvision::nms does not exist"), and
# once installed transformers imports it even for the PIL backend, breaking the test
# above (checked with pip download --no-deps torchvision==0.28.0 and a --target install).
# HF's PIL backend is the one ours matches exactly, and the one the test above pins.
