"""A strict safetensors header reader and memory-mapped tensor views.

Why our own reader instead of ``safetensors.safe_open``: a build needs the names,
dtypes and shapes of every tensor long before any data is read (to check a weight
plan against the graph), and a broken file must fail with a message that names
the file and the tensor and says what to do. The format is small: an 8-byte
little-endian header length, a JSON header, then the data section; offsets in the
header are relative to the data section.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from mobius.errors import SafetensorsError

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""Headers larger than this are treated as corrupt (real ones are a few MB at most)."""

MAX_RANK = 64
"""Most dimensions a tensor may have (numpy's limit; real weights have at most 5)."""

MAX_ELEMENT_BYTES = 2**63 - 1
"""Largest byte size a shape may describe (numpy's ``intp``); bigger shapes are refused even
for empty tensors, whose other dimensions numpy still multiplies out."""

DTYPE_SIZES: dict[str, int] = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
"""Bytes per element of each safetensors dtype code mobius reads."""

NUMPY_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype(np.bool_),
}
"""numpy dtype a tensor of each safetensors dtype code is viewed as."""

DTYPE_NAMES: dict[str, str] = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
"""mobius dtype name (the weight-plan / contract vocabulary) of each safetensors code."""

_FIX_DAMAGED = (
    "the file is damaged or was not written by a safetensors writer: re-download it "
    "(e.g. `hf download REPO --force-download`) or re-save it with "
    "safetensors.torch.save_file / save_pretrained(safe_serialization=True)"
)


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in a safetensors file; read from the header only."""

    name: str
    dtype: str
    """safetensors dtype code: ``BF16``, ``F16``, ``F32``, ``F64``, ``I64``, ``I32``, …"""
    shape: tuple[int, ...]
    file: Path
    """Absolute path of the file holding the tensor."""
    start: int
    """Absolute byte offset of the first data byte in :attr:`file`."""
    end: int
    """Absolute byte offset one past the last data byte."""

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes."""
        return self.end - self.start

    @property
    def dtype_name(self) -> str:
        """The mobius dtype name (``float32``, ``bfloat16``, …) of this tensor."""
        return DTYPE_NAMES[self.dtype]


def _error(path: Path, what: str, tensor: str | None = None) -> SafetensorsError:
    where = str(path) if tensor is None else f"{path}, tensor {_short(tensor)}"
    return SafetensorsError(what, where=where, fix=_FIX_DAMAGED)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_safetensors_header(path: str | os.PathLike[str]) -> list[TensorInfo]:
    """List the tensors of a safetensors file without reading their data.

    Validates strictly (lengths, JSON, dtypes, shapes, offsets, overlaps, sizes);
    any problem is a :class:`~mobius.errors.SafetensorsError` naming the file and,
    where there is one, the tensor. Tensors come back in file (offset) order.
    """
    path = Path(path).absolute()
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise _error(path, "is not a regular file (a folder, device or pipe)")
        file_size = st.st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise _error(path, f"file is {file_size} bytes, too short for a safetensors header")
            header_len = int.from_bytes(prefix, "little")
            if header_len > MAX_HEADER_BYTES:
                raise _error(
                    path,
                    f"header length {header_len} bytes is absurd (limit {MAX_HEADER_BYTES})",
                )
            if 8 + header_len > file_size:
                raise _error(
                    path,
                    f"header length {header_len} bytes runs past the end of the "
                    f"{file_size}-byte file (truncated download?)",
                )
            raw = f.read(header_len)
    except OSError as exc:
        raise SafetensorsError(
            f"cannot read safetensors file: {exc.strerror or exc}",
            where=str(path),
            fix="check that the file exists and is readable",
        ) from exc

    header = _parse_header_json(path, raw)

    data_start = 8 + header_len
    data_len = file_size - data_start
    infos: list[TensorInfo] = []
    for name, entry in header.items():
        if name == "__metadata__":
            _check_metadata(path, entry)
            continue
        infos.append(_parse_entry(path, name, entry, data_start, data_len))

    infos.sort(key=lambda t: (t.start, t.end))
    previous: TensorInfo | None = None
    for info in infos:
        if info.start == info.end:
            continue  # empty tensors occupy no bytes and cannot overlap
        if previous is not None and info.start < previous.end:
            raise _error(
                path,
                f"data overlaps tensor {previous.name!r} "
                f"(bytes {info.start}..{info.end} vs {previous.start}..{previous.end})",
                info.name,
            )
        previous = info
    return infos


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _parse_header_json(path: Path, raw: bytes) -> dict[str, Any]:
    """The header object; every way JSON text can be hostile becomes a SafetensorsError.

    ``json`` raises more than ``JSONDecodeError``: ``RecursionError`` for deeply nested
    arrays, ``ValueError`` for integers beyond Python's 4300-digit conversion limit.
    A name given twice would silently keep the last entry, so it is refused.
    """
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise _error(path, "header names this tensor twice", exc.key) from None
    except UnicodeDecodeError as exc:
        raise _error(path, f"header is not valid UTF-8 JSON ({exc})") from exc
    except RecursionError:
        raise _error(path, "header JSON is nested too deeply to be a safetensors header") from None
    except ValueError as exc:  # JSONDecodeError, and over-long integer literals
        raise _error(path, f"header is not valid UTF-8 JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise _error(path, f"header is a JSON {type(header).__name__}, expected an object")
    return header


def _check_metadata(path: Path, entry: Any) -> None:
    if not isinstance(entry, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in entry.items()
    ):
        raise _error(path, "__metadata__ must be an object of string to string", "__metadata__")


def _short(value: Any, limit: int = 200) -> str:
    """``repr`` cut to ``limit`` characters: hostile headers can hold megabyte-long values."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _parse_entry(path: Path, name: str, entry: Any, data_start: int, data_len: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise _error(path, f"header entry is a {type(entry).__name__}, expected an object", name)
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise _error(path, f"header entry has no {key!r}", name)
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise _error(
            path,
            f"unsupported dtype {_short(dtype)} (mobius reads {', '.join(DTYPE_SIZES)})",
            name,
        )
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _error(path, f"shape {_short(shape)} is not a list of non-negative integers", name)
    if len(shape) > MAX_RANK:
        raise _error(path, f"shape has {len(shape)} dimensions (at most {MAX_RANK})", name)
    if DTYPE_SIZES[dtype] * math.prod(d for d in shape if d) > MAX_ELEMENT_BYTES:
        raise _error(
            path, f"{dtype} {_short(shape)} needs more bytes than any file can hold (2**63)", name
        )
    offsets = entry["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets):
        raise _error(path, f"data_offsets {_short(offsets)} is not a pair of integers", name)
    begin, end = offsets
    if begin < 0 or begin > end:
        raise _error(path, f"data_offsets {offsets} are not 0 <= begin <= end", name)
    if end > data_len:
        raise _error(
            path,
            f"data_offsets end {end} is past the end of the {data_len}-byte data section "
            "(truncated file?)",
            name,
        )
    # Python ints: a hostile shape cannot overflow this product.
    expected = DTYPE_SIZES[dtype] * math.prod(shape)
    if end - begin != expected:
        raise _error(
            path,
            f"holds {end - begin} bytes but {dtype} {_short(shape)} needs {expected}",
            name,
        )
    return TensorInfo(
        name=name,
        dtype=dtype,
        shape=tuple(shape),
        file=path,
        start=data_start + begin,
        end=data_start + end,
    )


def read_tensor(info: TensorInfo) -> np.ndarray:
    """A read-only, memory-mapped numpy view of exactly one tensor's bytes.

    Nothing is copied: pages are read from disk when the array is touched, and
    the mapping closes when the last reference to the array goes away.
    """
    dtype = NUMPY_DTYPES[info.dtype]
    count = math.prod(info.shape)
    if count == 0:
        empty = np.empty(info.shape, dtype=dtype)
        empty.flags.writeable = False
        return empty
    try:
        mapped = np.memmap(info.file, dtype=dtype, mode="r", offset=info.start, shape=(count,))
    except (OSError, ValueError) as exc:
        raise SafetensorsError(
            f"cannot memory-map tensor data: {exc}",
            where=f"{info.file}, tensor {info.name!r}",
            fix="the file changed or shrank since its header was read; " + _FIX_DAMAGED,
        ) from exc
    return mapped.reshape(info.shape)


def _read_exact(f: io.FileIO, info: TensorInfo, offset: int, buffer: memoryview) -> None:
    """Fill ``buffer`` from absolute byte ``offset`` of ``info.file`` (an open raw file)."""
    f.seek(offset)
    filled = 0
    while filled < len(buffer):
        n = f.readinto(buffer[filled:])
        if not n:
            raise SafetensorsError(
                f"file ended at byte {offset + filled} inside the tensor's data "
                f"(bytes {info.start}..{info.end})",
                where=f"{info.file}, tensor {info.name!r}",
                fix="the file changed or shrank since its header was read; " + _FIX_DAMAGED,
            )
        filled += n


def _open_raw(info: TensorInfo) -> io.FileIO:
    try:
        return open(info.file, "rb", buffering=0)  # closed by the callers (with)
    except OSError as exc:
        raise SafetensorsError(
            f"cannot open tensor data: {exc.strerror or exc}",
            where=f"{info.file}, tensor {info.name!r}",
            fix="check that the file still exists and is readable",
        ) from exc


def read_tensor_copy(info: TensorInfo) -> np.ndarray:
    """One tensor read into a fresh, writable array with plain file reads (no memory map).

    Why not :func:`read_tensor`: touched pages of a memory map stay in the process's
    resident set while the mapping lives; a fresh array is freed as soon as it is dropped
    and the file's pages stay in the page cache, which the kernel can reclaim.
    """
    dtype = NUMPY_DTYPES[info.dtype]
    out = np.empty(info.shape, dtype=dtype)
    if out.size:
        with _open_raw(info) as f:
            _read_exact(f, info, info.start, memoryview(out.reshape(-1).view(np.uint8)))
    return out


def read_tensor_chunks(info: TensorInfo, begin: int, end: int, step: int) -> Iterator[np.ndarray]:
    """Flat elements ``begin:end`` of one tensor as 1-D arrays of at most ``step`` elements.

    Read with plain file reads into one buffer reused for every chunk (so memory stays
    ``step`` elements whatever the tensor's size): each chunk is only valid until the
    next one is requested. The file is opened on the first chunk and closed when the
    iteration ends or the iterator is dropped.
    """
    count = math.prod(info.shape)
    if not 0 <= begin <= end <= count or step < 1:
        raise ValueError(f"bad element range {begin}:{end} (step {step}) of {count} elements")
    if begin == end:
        return
    dtype = NUMPY_DTYPES[info.dtype]
    buffer = np.empty(min(step, end - begin) * dtype.itemsize, dtype=np.uint8)
    with _open_raw(info) as f:
        for pos in range(begin, end, step):
            nbytes = (min(pos + step, end) - pos) * dtype.itemsize
            view = buffer[:nbytes]
            _read_exact(f, info, info.start + pos * dtype.itemsize, memoryview(view))
            yield view.view(dtype)
