"""Golden files round-trip exactly (hex floats, ids, media arrays) and refuse tampering."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mt_helpers import l5_golden, synthetic_logits

from mobius_testing.golden import (
    GoldenError,
    Inputs,
    hexf,
    l4_from_logits,
    media_path,
    read_l4,
    read_l5,
    unhex,
    write_l4,
    write_l5,
)


@given(st.floats(allow_nan=False))
def test_hex_float_round_trip_is_bit_exact(x):
    back = unhex(hexf(x))
    assert back == x and math.copysign(1.0, back) == math.copysign(1.0, x)


def test_l4_round_trip_with_media_is_exact(tmp_path):
    logits = synthetic_logits() + 1e-13  # digits a decimal repr would need care for
    media = {"pixel_values": np.random.default_rng(3).random((1, 3, 4, 4), dtype=np.float32)}
    golden = l4_from_logits("cat", Inputs((2, 5, 7, 9), media), logits, 4, {"revision": None})
    path = write_l4(tmp_path, golden)
    back = read_l4(tmp_path, "cat")
    assert back.top_logits == golden.top_logits  # exact, not approximately
    assert back.summary == golden.summary
    assert back.positions_margin == golden.positions_margin
    assert back.top_ids == golden.top_ids and back.top1 == int(logits[-1].argmax())
    assert back.inputs.input_ids == (2, 5, 7, 9)
    np.testing.assert_array_equal(back.inputs.media["pixel_values"], media["pixel_values"])
    data = json.loads(path.read_text())
    assert data["top_k"]["logits"][0].startswith("0x")
    assert data["inputs"]["media"]["file"] == media_path(tmp_path, "cat").name


def test_l5_round_trip(tmp_path):
    golden = l5_golden([4, 5, 6], margins=[0.5, 1e-300, 3.0], pieces=["a", "\u00e9", "\n"])
    write_l5(tmp_path, golden)
    back = read_l5(tmp_path, "c")
    assert back == golden


def test_tampered_media_is_refused(tmp_path):
    media = {"input_features": np.ones((1, 8, 4), dtype=np.float32)}
    write_l4(tmp_path, l4_from_logits("a", Inputs((1, 2, 3, 4), media), synthetic_logits(), 3, {}))
    np.savez(media_path(tmp_path, "a"), input_features=np.zeros((1, 8, 4), dtype=np.float32))
    with pytest.raises(GoldenError, match="do not match the sha256"):
        read_l4(tmp_path, "a")


def test_missing_and_wrong_kind_goldens_say_what_to_do(tmp_path):
    with pytest.raises(GoldenError, match="golden file is missing") as err:
        read_l4(tmp_path, "nope")
    assert "mobius golden regen" in str(err.value)
    write_l5(tmp_path, l5_golden([1]))
    (tmp_path / "c.l4.json").write_text((tmp_path / "c.l5.json").read_text())
    with pytest.raises(GoldenError, match="expected a format-1 l4 golden"):
        read_l4(tmp_path, "c")


def test_a_user_npz_at_the_media_path_is_never_overwritten(tmp_path):
    """Only the media file a previous golden of the case names may be replaced."""
    from mobius.errors import PackageError

    mine = media_path(tmp_path, "cat")
    np.savez(mine, my_data=np.arange(5))
    before = mine.read_bytes()
    media = {"pixel_values": np.ones((1, 3, 4, 4), dtype=np.float32)}
    golden = l4_from_logits("cat", Inputs((2, 5, 7, 9), media), synthetic_logits(), 4, {})
    with pytest.raises(PackageError, match="a file that is not a golden media file is in the way"):
        write_l4(tmp_path, golden)
    assert mine.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name]
    mine.unlink()
    write_l4(tmp_path, golden)  # then a regen replaces its own media file
    write_l4(tmp_path, golden)
    assert read_l4(tmp_path, "cat").inputs.media.keys() == {"pixel_values"}
