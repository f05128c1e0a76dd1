"""The strict safetensors header reader and memory-mapped tensor views."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from mobius.checkpoint import read_safetensors_header, read_tensor
from mobius.errors import SafetensorsError

ALL_DTYPES = {
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for code, dtype in ALL_DTYPES.items():
        values = rng.normal(size=(3, 5)) * 50
        if dtype is np.bool_:
            out[code.lower()] = values > 0
        else:
            out[code.lower()] = values.astype(np.float32).astype(dtype)
    out["scalar"] = np.array(7.5, dtype=np.float32)
    out["empty"] = np.zeros((0, 4), dtype=np.float32)
    return out


def write_raw(path: Path, header: dict, data: bytes, *, header_len: int | None = None) -> Path:
    """Write a safetensors file by hand (to make malformed ones)."""
    raw = json.dumps(header).encode()
    n = len(raw) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


def test_lists_every_dtype_without_reading_data(tmp_path: Path) -> None:
    arrays = _arrays()
    path = tmp_path / "model.safetensors"
    save_file(arrays, str(path), metadata={"format": "np"})
    infos = {t.name: t for t in read_safetensors_header(path)}
    assert set(infos) == set(arrays)
    for code in ALL_DTYPES:
        info = infos[code.lower()]
        assert info.dtype == code
        assert info.shape == (3, 5)
        assert info.file == path.absolute()
        assert info.end - info.start == arrays[code.lower()].nbytes
    assert infos["scalar"].shape == ()
    assert infos["empty"].shape == (0, 4)


def test_reads_are_readonly_memmap_views_and_round_trip(tmp_path: Path) -> None:
    arrays = _arrays()
    path = tmp_path / "model.safetensors"
    save_file(arrays, str(path))
    for info in read_safetensors_header(path):
        view = read_tensor(info)
        expected = arrays[info.name]
        assert view.dtype == expected.dtype, info.name
        assert view.shape == expected.shape
        np.testing.assert_array_equal(view, expected)
        assert not view.flags.writeable
        if view.size:
            assert isinstance(view.base, np.memmap) or isinstance(view, np.memmap)
    bf16 = next(t for t in read_safetensors_header(path) if t.dtype == "BF16")
    view = read_tensor(bf16)
    assert view.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(view.astype(np.float32), arrays["bf16"].astype(np.float32))


def test_view_reads_exactly_that_tensor(tmp_path: Path) -> None:
    path = tmp_path / "two.safetensors"
    save_file(
        {"a": np.arange(4, dtype=np.int32), "b": np.arange(10, 16, dtype=np.int32)}, str(path)
    )
    infos = {t.name: t for t in read_safetensors_header(path)}
    np.testing.assert_array_equal(read_tensor(infos["b"]), [10, 11, 12, 13, 14, 15])
    np.testing.assert_array_equal(read_tensor(infos["a"]), [0, 1, 2, 3])


def test_metadata_must_be_str_to_str(tmp_path: Path) -> None:
    good = write_raw(
        tmp_path / "good.safetensors",
        {"__metadata__": {"k": "v"}, "t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}},
        b"\x01\x02",
    )
    assert [t.name for t in read_safetensors_header(good)] == ["t"]
    bad = write_raw(tmp_path / "bad.safetensors", {"__metadata__": {"k": 1}}, b"")
    with pytest.raises(SafetensorsError, match="__metadata__"):
        read_safetensors_header(bad)


def _entry(dtype: str = "F32", shape=(2,), offsets=(0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


MALFORMED_TENSOR = {
    "offsets past end": ({"w": _entry(offsets=(0, 16))}, b"\0" * 8, "past the end"),
    "overlap": (
        {"w": _entry(offsets=(0, 8)), "v": _entry(offsets=(4, 12))},
        b"\0" * 12,
        "overlaps",
    ),
    "size mismatch": ({"w": _entry(shape=(3,), offsets=(0, 8))}, b"\0" * 8, "needs 12"),
    "bad dtype": ({"w": _entry(dtype="F8_E9")}, b"\0" * 8, "unsupported dtype"),
    "missing dtype": ({"w": {"shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "'dtype'"),
    "missing offsets": ({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "'data_offsets'"),
    "negative dim": ({"w": _entry(shape=(-2,))}, b"\0" * 8, "non-negative"),
    "float dim": ({"w": {**_entry(), "shape": [2.0]}}, b"\0" * 8, "non-negative"),
    "bool dim": ({"w": {**_entry(), "shape": [True]}}, b"\0" * 8, "non-negative"),
    "offsets not ints": ({"w": {**_entry(), "data_offsets": [0, "8"]}}, b"\0" * 8, "pair"),
    "begin after end": ({"w": _entry(offsets=(8, 0))}, b"\0" * 8, "begin <= end"),
    "entry not object": ({"w": [1, 2]}, b"", "expected an object"),
    "huge product": (
        {"w": _entry(dtype="F64", shape=(2**40, 2**40, 2**40), offsets=(0, 8))},
        b"\0" * 8,
        "needs",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_TENSOR))
def test_malformed_tensor_entries_name_file_and_tensor(tmp_path: Path, case: str) -> None:
    header, data, message = MALFORMED_TENSOR[case]
    path = write_raw(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(SafetensorsError, match=message) as info:
        read_safetensors_header(path)
    text = str(info.value)
    assert str(path.absolute()) in text
    assert any(f"tensor {name!r}" in text for name in header)
    assert "re-download" in text and "re-save" in text


def test_truncated_data_names_file_and_tensor(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"weight": np.ones((64,), dtype=np.float32)}, str(path))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SafetensorsError, match="truncated") as info:
        read_safetensors_header(path)
    assert "'weight'" in str(info.value) and str(path.absolute()) in str(info.value)


FILE_LEVEL = {
    "shorter than 8 bytes": (lambda p: p.write_bytes(b"\x01\x02\x03"), "too short"),
    "header length past file": (
        lambda p: write_raw(p, {}, b"", header_len=1000),
        "runs past the end",
    ),
    "absurd header length": (
        lambda p: p.write_bytes(struct.pack("<Q", 2**40) + b"{}"),
        "absurd",
    ),
    "bad json": (lambda p: p.write_bytes(struct.pack("<Q", 5) + b"{oops"), "UTF-8 JSON"),
    "bad utf8": (lambda p: p.write_bytes(struct.pack("<Q", 2) + b"\xff\xfe"), "UTF-8 JSON"),
    "not an object": (lambda p: write_raw(p, [1, 2], b""), "expected an object"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("case", sorted(FILE_LEVEL))
def test_malformed_files_name_the_file(tmp_path: Path, case: str) -> None:
    make, message = FILE_LEVEL[case]
    path = tmp_path / "bad.safetensors"
    make(path)
    with pytest.raises(SafetensorsError, match=message) as info:
        read_safetensors_header(path)
    assert str(path.absolute()) in str(info.value)


def test_missing_file_is_a_safetensors_error(tmp_path: Path) -> None:
    with pytest.raises(SafetensorsError, match="cannot read"):
        read_safetensors_header(tmp_path / "nope.safetensors")


def test_empty_tensors_at_same_offset_do_not_overlap(tmp_path: Path) -> None:
    path = write_raw(
        tmp_path / "e.safetensors",
        {
            "a": _entry(shape=(0,), offsets=(0, 0)),
            "b": _entry(shape=(0, 3), offsets=(0, 0)),
            "c": _entry(offsets=(0, 8)),
        },
        b"\0" * 8,
    )
    infos = {t.name: t for t in read_safetensors_header(path)}
    assert read_tensor(infos["b"]).shape == (0, 3)
