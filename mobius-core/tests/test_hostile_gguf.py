"""Hostile GGUF files: every lie a header can tell costs one line of error, bounded time
and memory, and writes nothing.

Each case starts from a valid file and patches the bytes of one field (found with the
``gguf`` package's own reader), then builds it: ``mobius.build`` must raise a
CheckpointError whose message is one line, within 5 s and 64 MiB of Python allocations
(numpy's included), and OUT must not appear.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from test_gguf import ToyFamily, host_with, toy_file

import mobius
from mobius.errors import CheckpointError

MiB = 1 << 20


def valid(path: Path) -> Path:
    tokens = [f"t{i}" for i in range(300)]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": [], "toy.key_one": 1, "toy.key_two": 2}  # fmt: skip
    tensors = [
        ("a.weight", np.ones((4, 32), np.float32), "F32"),
        ("b.weight", np.full((4, 64), 0.5, np.float32), "Q8_0"),
    ]
    return toy_file(path, tensors, meta)


def field_offset(path: Path, key: str, part: int) -> int:
    """Byte offset of part ``part`` of metadata field (or tensor info) ``key``."""
    reader = gguf.GGUFReader(path)
    field = reader.fields.get(key) or next(t.field for t in reader.tensors if t.name == key)
    return field.offset + sum(int(p.nbytes) for p in field.parts[:part])


def patch(path: Path, offset: int, value: int | bytes, size: int = 8) -> Path:
    data = bytearray(path.read_bytes())
    raw = value if isinstance(value, bytes) else int(value).to_bytes(size, "little")
    data[offset : offset + len(raw)] = raw
    path.write_bytes(bytes(data))
    return path


def refused(path: Path, tmp_path: Path, match: str, family: ToyFamily | None = None) -> str:
    out = tmp_path / "out"
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(CheckpointError) as info:
            mobius.build(str(path), out, host=host_with(family))
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    what = info.value.what
    assert "\n" not in what, what
    assert match in what, what
    assert info.value.where and info.value.fix
    assert seconds <= 5, f"{seconds:.1f} s"
    assert peak <= 64 * MiB, f"{peak / MiB:.0f} MiB"
    assert not out.exists()
    return what


def test_the_valid_file_opens(tmp_path):
    ckpt = host_with().open_checkpoint(str(valid(tmp_path / "m.gguf")), None)
    assert set(ckpt.tensors) == {"a.weight", "b.weight"}


@pytest.mark.parametrize("keep", [0, 3, 20, 24, 60, 200, 1500, -1])
def test_truncated(tmp_path, keep):
    path = valid(tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-100])
    refused(path, tmp_path, "m.gguf")


def test_tensor_data_offset_past_the_end(tmp_path):
    path = valid(tmp_path / "m.gguf")
    refused(patch(path, field_offset(path, "b.weight", 5), 1 << 40), tmp_path, "past the end")


def test_tensor_count_of_2_to_the_40(tmp_path):
    path = patch(valid(tmp_path / "m.gguf"), 8, 1 << 40)
    refused(path, tmp_path, f"claims {1 << 40} tensors")


def test_metadata_key_count_of_2_to_the_40(tmp_path):
    path = patch(valid(tmp_path / "m.gguf"), 16, 1 << 40)
    refused(path, tmp_path, "metadata keys")


def test_metadata_string_of_2_to_the_31_bytes(tmp_path):
    path = valid(tmp_path / "m.gguf")
    patch(path, field_offset(path, "general.name", 3), 1 << 31)
    refused(path, tmp_path, f"claims {1 << 31} bytes")


@pytest.mark.parametrize("count", [1 << 40, (1 << 23) + 1])
def test_metadata_array_of_too_many_elements(tmp_path, count):
    path = valid(tmp_path / "m.gguf")
    patch(path, field_offset(path, "tokenizer.ggml.tokens", 4), count)
    refused(path, tmp_path, f"claims {count} elements")


def test_unknown_tensor_type(tmp_path):
    path = valid(tmp_path / "m.gguf")
    patch(path, field_offset(path, "a.weight", 4), 99, size=4)
    refused(path, tmp_path, "unknown type 99")


@pytest.mark.parametrize(("n_dims", "match"), [(5, "5 dimensions"), (1 << 31, "past the end")])
def test_too_many_dimensions(tmp_path, n_dims, match):
    path = valid(tmp_path / "m.gguf")
    patch(path, field_offset(path, "b.weight", 2), n_dims, size=4)  # the last tensor info
    refused(path, tmp_path, match)


def test_dimensions_whose_product_overflows(tmp_path):
    path = valid(tmp_path / "m.gguf")
    at = field_offset(path, "a.weight", 3)
    patch(path, at, 1 << 62)
    patch(path, at + 8, 1 << 62)
    refused(path, tmp_path, "does not fit the file")


def test_duplicate_tensor_names(tmp_path):
    path = valid(tmp_path / "m.gguf")
    patch(path, field_offset(path, "b.weight", 1), b"a.weight")
    refused(path, tmp_path, "duplicated tensor")


def test_duplicate_metadata_keys(tmp_path):
    path = valid(tmp_path / "m.gguf")
    patch(path, field_offset(path, "toy.key_two", 1), b"toy.key_one")
    refused(path, tmp_path, "given twice")


def test_a_tensor_the_family_does_not_know(tmp_path):
    tensors = [("a.weight", np.ones(32, np.float32), "F32"),
               ("unknown.rope_freqs", np.ones(8, np.float32), "F32")]  # fmt: skip
    path = toy_file(tmp_path / "m.gguf", tensors)
    refused(path, tmp_path, "'unknown.rope_freqs'")


@pytest.mark.parametrize("content", [b"", b"GGUF", b"\x00" * 64, b"NOTAGGUF" * 100])
def test_not_a_gguf_file(tmp_path, content):
    path = tmp_path / "m.gguf"
    path.write_bytes(content)
    refused(path, tmp_path, "m.gguf")


def test_a_million_scores_read_in_bounded_time_and_memory(tmp_path):
    """Numeric metadata arrays (a vocabulary's scores and token types) are one read, not
    one numpy view per element (1M elements cost the bare reader ~45 s and 700 MB). The
    bound leaves room for a loaded machine (~1 s alone; 5.1 s once with five jobs on two
    cores) and still fails the per-element reader by 3×."""
    from mobius.checkpoint.gguf import read_gguf

    scores = [float(i % 97) for i in range(1_000_000)]
    tensors = [("a.weight", np.ones(32, np.float32), "F32")]
    path = toy_file(tmp_path / "m.gguf", tensors, {"toy.scores": scores, "toy.flag": True})
    tracemalloc.start()
    started = time.perf_counter()
    try:
        metadata, _ = read_gguf(path)
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert metadata["toy.scores"] == scores and metadata["toy.flag"] is True
    assert seconds <= 15, f"{seconds:.1f} s"
    assert peak <= 256 * MiB, f"{peak / MiB:.0f} MiB"
