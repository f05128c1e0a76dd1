"""Fuzzing the safetensors header reader and checkpoint opening: only MobiusErrors come out.

Hypothesis writes malformed files (random bytes, lying header lengths, hostile JSON,
unknown dtypes, negative / fractional / 2**62 / 2**70 dimensions, offsets past the
end, non-UTF-8 and surrogate names, deeply nested JSON) and every example must end
either in a clean :class:`~mobius.errors.MobiusError` or in tensors that really lie
inside the file and can be read. Any other exception, an example running past the
guard's time limit, or an allocation beyond the guard's memory limit fails the test.

Budget, guard and counts come from :mod:`mobius_testing.fuzz`: profile
``mobius-fuzz-ci`` (200 examples per target, the default) or ``mobius-fuzz-long``
(20 000 per target) via ``MOBIUS_FUZZ_PROFILE=long`` (``tox -e fuzz``). The number of
examples run per target is printed at the end of the module and, when
``MOBIUS_FUZZ_COUNTS`` names a file, appended to it as JSON lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mobius.checkpoint import open_local, read_safetensors_header
from mobius.checkpoint.safetensors import DTYPE_SIZES
from mobius.errors import MobiusError, SafetensorsError
from mobius_testing.fuzz import FUZZ, MEMORY_LIMIT, guard, report_counts

COUNTS: Counter[str] = Counter()
_report_counts = report_counts(COUNTS)

# ------------------------------------------------------------------------ strategies

DTYPES = st.one_of(
    st.sampled_from(sorted(DTYPE_SIZES)),
    st.sampled_from(["F8_E4M3", "bf16", "", "U64", "complex64"]),
    st.integers(),
    st.none(),
    st.lists(st.text(max_size=3), max_size=2),
)
DIMS = st.one_of(
    st.integers(0, 8),
    st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64, 2**70, -1, -(2**62)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)
SHAPES = st.one_of(
    st.lists(DIMS, max_size=6), st.lists(st.integers(0, 1), min_size=60, max_size=70)
)
OFFSETS = st.one_of(
    st.lists(st.integers(-4, 4096) | st.sampled_from([2**62, 2**64, -(2**63)]), max_size=3),
    st.tuples(st.integers(0, 512), st.integers(0, 512)).map(list),
    st.lists(st.floats() | st.text(max_size=2) | st.booleans(), max_size=2),
    st.integers() | st.none(),
)
NAMES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["__metadata__", "", "../x", "\ud800", "a\x00b", "w"]),
)
JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
ENTRIES = st.one_of(
    st.fixed_dictionaries({"dtype": DTYPES, "shape": SHAPES, "data_offsets": OFFSETS}),
    st.fixed_dictionaries({}, optional={"dtype": DTYPES, "shape": SHAPES, "data_offsets": OFFSETS}),
    JSON_VALUES,
)
HEADERS = st.dictionaries(NAMES, ENTRIES, max_size=5)


@st.composite
def plausible_tensors(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    """Mostly-valid headers (real layouts) with one field pushed off the edge."""
    n = draw(st.integers(1, 4))
    header: dict[str, Any] = {}
    offset = 0
    for i in range(n):
        dtype = draw(st.sampled_from(sorted(DTYPE_SIZES)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        size = DTYPE_SIZES[dtype] * int(np.prod(shape, dtype=np.int64))
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    data = draw(st.binary(min_size=offset, max_size=offset))
    victim = header[draw(st.sampled_from(sorted(header)))]
    field = draw(st.sampled_from(["none", "dtype", "shape", "begin", "end", "data"]))
    if field == "dtype":
        victim["dtype"] = draw(DTYPES)
    elif field == "shape":
        victim["shape"] = draw(SHAPES)
    elif field == "begin":
        victim["data_offsets"][0] += draw(st.integers(-3, 3))
    elif field == "end":
        victim["data_offsets"][1] = draw(st.sampled_from([2**62, 2**63, offset + 1, -1]))
    elif field == "data":
        data = data[: draw(st.integers(0, len(data)))]
    return header, data


def encode(header: Any) -> bytes:
    """JSON bytes; lone surrogates go out as \\ud800 escapes (ensure_ascii)."""
    return json.dumps(header).encode("ascii")


def pack(raw: bytes, data: bytes = b"", *, header_len: int | None = None) -> bytes:
    n = len(raw) if header_len is None else header_len
    return struct.pack("<Q", n % 2**64) + raw + data


# ------------------------------------------------------------------------ checks


def check_file(content: bytes, target: str) -> None:
    """Write ``content`` as a safetensors file and read it: MobiusError or a sound result."""
    COUNTS[target] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(content)
        with guard():
            try:
                infos = read_safetensors_header(path)
            except SafetensorsError as exc:
                assert str(path) in (exc.where or ""), exc  # the error names the file
                return
            size = len(content)
            for info in infos:
                assert 0 <= info.start <= info.end <= size
                assert info.nbytes == DTYPE_SIZES[info.dtype] * int(np.prod(info.shape))
                from mobius.checkpoint import read_tensor

                array = read_tensor(info)
                assert array.shape == info.shape
                assert array.nbytes == info.nbytes
                del array


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(content: bytes) -> None:
    check_file(content, "safetensors:random-bytes")


@FUZZ
@given(
    st.binary(max_size=256),
    st.binary(max_size=64),
    st.one_of(st.none(), st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**62, 2**63])),
)
def test_lying_header_length(raw: bytes, data: bytes, header_len: int | None) -> None:
    check_file(pack(raw, data, header_len=header_len), "safetensors:header-length")


@FUZZ
@given(HEADERS, st.binary(max_size=256), st.integers(-2, 2))
def test_hostile_json_headers(header: dict[str, Any], data: bytes, skew: int) -> None:
    raw = encode(header)
    check_file(pack(raw, data, header_len=max(0, len(raw) + skew)), "safetensors:json-header")


@FUZZ
@given(plausible_tensors())
def test_plausible_files_off_by_one(case: tuple[dict[str, Any], bytes]) -> None:
    header, data = case
    check_file(pack(encode(header), data), "safetensors:plausible")


@FUZZ
@given(st.binary(min_size=1, max_size=12), st.sampled_from(["name", "dtype", "key"]))
def test_non_utf8_names(junk: bytes, place: str) -> None:
    header = {"NAME": {"dtype": "DTYPE", "shape": [1], "data_offsets": [0, 4]}}
    raw = encode(header)
    marker = {"name": b"NAME", "dtype": b"DTYPE", "key": b"shape"}[place]
    check_file(pack(raw.replace(marker, junk), b"\0" * 4), "safetensors:non-utf8")


@FUZZ
@given(st.integers(1, 200_000), st.sampled_from(["[", '{"a":', '{"t":{"shape":']))
def test_deeply_nested_json(depth: int, opener: str) -> None:
    closer = {"[": "]", '{"a":': "}", '{"t":{"shape":': "}"}[opener]
    raw = (opener * depth + "0" + closer * depth).encode()
    check_file(pack(raw), "safetensors:nested")


@FUZZ
@given(st.integers(4301, 20_000), st.sampled_from(["shape", "offset", "top"]))
def test_integer_literals_beyond_python_limit(digits: int, place: str) -> None:
    big = "9" * digits
    text = {
        "shape": '{"w":{"dtype":"F32","shape":[' + big + '],"data_offsets":[0,4]}}',
        "offset": '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,' + big + "]}}",
        "top": big,
    }[place]
    check_file(pack(text.encode(), b"\0" * 4), "safetensors:big-int")


# ------------------------------------------------------------- opening a checkpoint


@st.composite
def checkpoint_folders(draw: st.DrawFn) -> dict[str, bytes]:
    """config.json + safetensors files, sometimes with an index naming hostile shards."""
    files: dict[str, bytes] = {"config.json": b'{"model_type": "tiny"}'}
    shard_names = ["model-1.safetensors", "model-2.safetensors"]
    for name in shard_names[: draw(st.integers(1, 2))]:
        header, data = draw(plausible_tensors())
        files[name] = pack(encode(header), data)
    if draw(st.booleans()):
        shard = st.sampled_from(
            [
                *shard_names,
                "../model-1.safetensors",
                "/etc/passwd",
                "sub/../../x.safetensors",
                "./model-1.safetensors",
                "C:model-1.safetensors",
                "a\\b",
                "",
                ".",
                "..",
                "\x00",
            ]
        ) | st.text(max_size=8)
        weight_map = draw(
            st.dictionaries(st.sampled_from(["t0", "t1", "t2", "t3"]) | NAMES, shard, max_size=5)
        )
        index: Any = draw(st.sampled_from([{"weight_map": weight_map}, weight_map, [weight_map]]))
        raw = encode(index)
        if draw(st.booleans()):  # the same tensor claimed twice with different shards
            raw = raw.replace(
                b'{"weight_map": {', b'{"weight_map": {"t0": "model-2.safetensors", ', 1
            )
        files["model.safetensors.index.json"] = raw
    return files


@FUZZ
@given(checkpoint_folders())
def test_open_and_read_checkpoint(files: dict[str, bytes]) -> None:
    COUNTS["checkpoint:open-and-read"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        root.mkdir()
        for name, content in files.items():
            (root / name).write_bytes(content)
        with guard():
            try:
                ckpt = open_local(root)
                for name, info in ckpt.tensors.items():
                    assert info.file.parent == root.resolve() or info.file.parent == root
                    assert ckpt.read(name).shape == info.shape
            except MobiusError:
                pass


# ------------------------------------------------------------------ memory budget


def _peak_bytes(content: bytes) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(content)
        tracemalloc.start()
        try:
            with contextlib.suppress(MobiusError):
                read_safetensors_header(path)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


@pytest.mark.parametrize(
    "case",
    [
        pack(b"{}", header_len=MEMORY_LIMIT),  # header claims 1 GiB, file has 2 bytes
        pack(b"{}", header_len=2**63),
        pack(encode({"w": {"dtype": "F32", "shape": [2**62], "data_offsets": [0, 2**64]}})),
        pack(encode({"w": {"dtype": "BF16", "shape": [2**62, 2**62], "data_offsets": [0, 4]}})),
        pack(encode({"w": {"dtype": "F32", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}})),
    ],
    ids=["1GiB-header", "2**63-header", "2**64-offsets", "2**124-shape", "empty-huge"],
)
def test_header_claimed_sizes_are_never_allocated(case: bytes) -> None:
    """Reading a header that claims huge sizes allocates about nothing (tracemalloc peak)."""
    assert _peak_bytes(case) < 256 * 1024


def test_empty_tensor_with_huge_dims_is_refused_before_numpy(tmp_path: Path) -> None:
    """numpy cannot even describe a (0, 2**62) float32 array: the header reader says so."""
    path = tmp_path / "m.safetensors"
    path.write_bytes(
        pack(encode({"w": {"dtype": "F32", "shape": [0, 2**62], "data_offsets": [0, 0]}}))
    )
    with pytest.raises(SafetensorsError, match="needs more bytes"):
        read_safetensors_header(path)


def test_too_many_dimensions_and_duplicate_names_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(
        pack(encode({"w": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}}), b"\0" * 4)
    )
    with pytest.raises(SafetensorsError, match="65 dimensions"):
        read_safetensors_header(path)
    entry = '{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    path.write_bytes(pack(('{"w":' + entry + ',"w":' + entry + "}").encode(), b"\0" * 4))
    with pytest.raises(SafetensorsError, match="twice"):
        read_safetensors_header(path)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with guard(), pytest.raises(SafetensorsError, match="not a regular file"):
        read_safetensors_header(fifo)
