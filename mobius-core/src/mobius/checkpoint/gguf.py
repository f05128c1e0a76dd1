"""Open a GGUF file (llama.cpp's format) as a checkpoint.

``mobius build MODEL.gguf OUT`` reads what llama.cpp, Ollama and LM Studio users hold:
one ``.gguf`` file, a folder holding one, or the first file of a split
(``NAME-00001-of-00003.gguf``). The file is read with the ``gguf`` package's
:class:`gguf.GGUFReader`, never a parser of our own; this module only bounds it, because
a GGUF file is untrusted input like a safetensors header:

- every read the reader makes must lie inside the file (a truncated file, a string or
  an array that claims more bytes than there are, a tensor whose data runs past the
  end), and the counts it loops over are capped before it loops (tensors, keys, array
  elements in all), so a hostile file costs bounded time and memory;
- tensor infos are checked: at most 4 dimensions, a type the ``gguf`` package knows and
  can dequantize, data aligned, inside the file and overlapping no other tensor, one
  name once (across the files of a split too).

Core knows no architecture: the family that answers ``mobius_gguf_translation`` for the
file's ``general.architecture`` gives the HF ``config.json`` object and the HF name of
every tensor, with the transforms that undo llama.cpp's conversion (offered here:
:func:`unpermute_rows`, :func:`add_constant`, :func:`pad_rows`). The tokenizer, chat
template and stop ids come from the metadata (:mod:`mobius.checkpoint.gguf_tokenizer`)
and are offered as the checkpoint's side files.

Tensors are served lazily, like safetensors tensors: nothing is read until the package
is written, then each tensor is read with plain file reads (no memory map) and
dequantized with ``gguf.quants.dequantize``, whole or a bounded range of rows at a time.
A build that keeps the file's quantization (the default: no ``--quant``, no ``--dtype``)
asks :meth:`GGUFCheckpoint.kept_scheme` how each tensor is stored and reads the blocks of
:data:`STORED_FORMS` types through :meth:`GGUFCheckpoint.stored_quantized` instead.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from mobius.checkpoint.base import Checkpoint, SourceInfo
from mobius.errors import CheckpointError

if TYPE_CHECKING:
    from mobius.plugins import PluginHost

SUFFIX = ".gguf"
SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
"""llama.cpp's ``gguf-split`` file names."""

MAX_TENSORS = 1 << 20
"""Most tensor infos one file may declare (real files: a few hundred to a few thousand)."""
MAX_KEYS = 1 << 16
"""Most metadata keys one file may declare (real files: a few dozen)."""
MAX_ARRAY_ELEMENTS = 1 << 23
"""Most metadata array elements one file may hold in all (a 262k vocabulary with scores,
types and merges is about 1M); the reader keeps a small numpy view per element."""
MAX_DIMS = 4
"""ggml tensors have at most 4 dimensions (GGML_MAX_DIMS)."""
MAX_SPLITS = 1024

FIX_DAMAGED = (
    "the file is damaged or was not written by a GGUF writer: download it again "
    "(compare its sha256 with the publisher's) or convert the model again with "
    "llama.cpp's convert_hf_to_gguf.py"
)

_PLAIN = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F64": "float64",
    "I8": "int8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
}
"""GGUF types served as they are (mobius dtype name); every other type is dequantized to
float32."""

STORED_FORMS: dict[str, tuple[int, int, bool]] = {
    "Q8_0": (8, 32, False),
    "Q4_0": (4, 32, False),
    "Q5_0": (8, 32, False),
    "Q6_K": (8, 16, False),
    "Q4_1": (4, 32, True),
    "Q4_K": (4, 32, True),
}
"""GGUF types whose blocks are exactly a MatMulNBits / GatherBlockQuantized scheme:
type → (bits, block size, float zero points). Q8_0 / Q4_0 / Q5_0 / Q6_K hold
``d · (q − c)`` (Q6_K: ``d · sc · (q − 32)`` per 16 values), kept as symmetric levels
``q − c + 2**(bits−1)`` (Q5_0 and Q6_K in 8 bits) with the scale ``d`` (``d · sc``,
exact in float32); Q4_1 / Q4_K hold ``d · q + m`` (Q4_K: ``d·sc · q − dmin·m`` per 32),
kept as 4-bit levels ``q`` with the scale and the float zero point ``−m / scale``
(MatMulNBits reads ``(q − zp) · scale``: one float rounding), or, by ``--target cpu``
(:data:`EXACT_CPU`), as symmetric 4-bit levels ``q`` (MatMulNBits' default zero point 8)
with the scale ``d`` and a per-block correction ``c = m + 8·d`` added by the graph
(``QuantScheme.block_correction``). The levels are read by ``gguf.quants.dequantize``
itself, of each block with its scales set to 1."""

APPROXIMATED = ("Q4_1", "Q5_1", "Q4_K", "Q5_K")
"""GGUF types with a float minimum per block: float zero points are exact but
onnxruntime's CPU kernel runs them unpacked (65× slower), and takes none in 8 bits.
With ``--target cpu``, Q4_1 / Q4_K tensors read by MatMul only take the exact
:data:`EXACT_CPU` form; the others (Q5_1 / Q5_K, and a Q4_1 / Q4_K table a Gather reads:
an embedding, a tied head) are requantized from gguf's dequantization into
:data:`CPU_FORM` blocks with integer zero points (the fast kernel), the largest weight
error printed."""

CPU_FORM = (8, 32)
"""``--target cpu``'s approximation of :data:`APPROXIMATED` types: bits, block size."""

EXACT_CPU = ("Q4_1", "Q4_K")
"""``--target cpu``'s exact form of these types' MatMul weights: ``w = d·(q − 8) + c``
per block of 32 (``c = m + 8·d``), MatMulNBits int4 with no zero-point input plus
``ReduceSum(x by blocks of 32) @ C`` (``QuantScheme.block_correction``): 4.5 bits a
value plus the ``[K/32, N]`` float corrections, and onnxruntime's fast int4 kernel."""

_UNIT_SCALE: dict[str, tuple[tuple[int, bytes], ...]] = {
    "Q8_0": ((0, b"\x00\x3c"),),
    "Q4_0": ((0, b"\x00\x3c"),),
    "Q5_0": ((0, b"\x00\x3c"),),
    "Q4_1": ((0, b"\x00\x3c\x00\x00"),),
    "Q6_K": ((192, b"\x01" * 16 + b"\x00\x3c"),),
    "Q4_K": ((0, b"\x00\x3c\x00\x00" + b"\x01" * 4 + b"\x00" * 4 + b"\x01" * 4),),
}
"""(byte offset, bytes) written into each block of a :data:`STORED_FORMS` type so that
gguf's dequantization gives its levels: fp16 scales 1 (``0x3c00``), minimums 0, Q6_K's
int8 sub-scales 1, Q4_K's packed 6-bit sub-scales 1 and sub-minimums 0."""

_NUMPY = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype("<f8"),
    "int8": np.dtype("i1"),
    "int16": np.dtype("<i2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
}


# --------------------------------------------------------------------------- transforms


class Transform(ABC):
    """A transform a family asks for to undo one of llama.cpp's conversions.

    It works on rows (the first axis of a 2-D tensor, all leading axes flattened
    otherwise): :meth:`group` rows at a time, so a tensor can be streamed in bounded
    pieces. :meth:`out_shape` may change the number of rows (rows past the stored ones
    are read as zeros), never the row length.
    """

    moves_rows: bool = False
    """Whether it only moves (or adds zero) rows, never changing a value: then a
    tensor's quantized blocks can be kept, their rows moved the same way."""

    def out_shape(self, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
        """The shape after this transform; CheckpointError when it cannot apply."""
        return shape

    def group(self, shape: tuple[int, ...]) -> int:
        """Rows that must be transformed together (a divisor of the row count)."""
        return 1

    @abstractmethod
    def apply(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Transform whole groups of rows (2-D: rows × row length) of a tensor whose
        stored shape is ``shape``."""


@dataclass(frozen=True)
class _Unpermute(Transform):
    n_head: int
    moves_rows = True

    def out_shape(self, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
        if not shape or shape[0] % (2 * self.n_head):
            raise CheckpointError(
                f"cannot undo llama.cpp's q/k row permutation for {self.n_head} heads on a "
                f"tensor of shape {list(shape)} (rows must be a multiple of 2 × heads)",
                where=where,
                fix="check the head counts in the file's metadata against the tensor",
            )
        return shape

    def group(self, shape: tuple[int, ...]) -> int:
        return shape[0] // self.n_head

    def apply(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        per_head = self.group(shape)
        heads = rows.shape[0] // per_head
        return rows.reshape(heads, per_head // 2, 2, -1).swapaxes(1, 2).reshape(rows.shape)


@dataclass(frozen=True)
class _AddConstant(Transform):
    value: float

    def apply(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return (rows.astype(np.float32) + np.float32(self.value)).astype(rows.dtype)


@dataclass(frozen=True)
class _PadRows(Transform):
    rows: int
    moves_rows = True

    def out_shape(self, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
        if not shape or shape[0] > self.rows:
            raise CheckpointError(
                f"tensor of shape {list(shape)} has more rows than the {self.rows} it is padded to",
                where=where,
                fix="check the vocabulary size in the file's metadata against the tensor",
            )
        return (self.rows, *shape[1:])

    def apply(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return rows  # the reader gives the rows past the stored ones as zeros


def unpermute_rows(n_head: int) -> Transform:
    """Undo llama.cpp's rope row permutation of Llama / Mistral q and k weights
    (``n_head``: attention heads for q, KV heads for k). Its converter stores
    ``w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)``; this applies the
    inverse, ``reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2)``."""
    if not isinstance(n_head, int) or n_head < 1:
        raise ValueError(f"n_head must be a positive integer, got {n_head!r}")
    return _Unpermute(n_head)


def add_constant(value: float) -> Transform:
    """Add ``value`` to every element (``add_constant(-1.0)`` undoes the ``norm + 1`` that
    llama.cpp's converter stores for Gemma 1–3 RMSNorm weights)."""
    return _AddConstant(float(value))


def pad_rows(rows: int) -> Transform:
    """Pad the first axis with zero rows up to ``rows`` (Gemma 3 files may cut the
    embedding to the tokenizer's vocabulary)."""
    return _PadRows(int(rows))


# --------------------------------------------------------------------------- tensor infos


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of a GGUF file, under its HF name; read from the tensor infos only."""

    name: str
    """The HF weight name the family gave."""
    gguf_name: str
    ggml_type: str
    """The GGUF type name: ``F32``, ``F16``, ``Q8_0``, ``Q4_K`` …"""
    stored_shape: tuple[int, ...]
    """numpy order (slowest axis first), as stored."""
    shape: tuple[int, ...]
    """After the transforms."""
    file: Path
    start: int
    """Absolute offset of the first data byte in :attr:`file`."""
    end: int
    transforms: tuple[Transform, ...] = ()

    @property
    def dtype_name(self) -> str:
        """The mobius dtype name served: float types as stored, quantized types float32."""
        return _PLAIN.get(self.ggml_type, "float32")

    @property
    def nbytes(self) -> int:
        """Bytes of the served (dequantized, transformed) tensor."""
        return math.prod(self.shape) * _NUMPY[self.dtype_name].itemsize

    @property
    def row_length(self) -> int:
        return self.stored_shape[-1] if self.stored_shape else 1

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1]) if self.shape else 1

    @property
    def group(self) -> int:
        shape = self.shape if len(self.shape) > 1 else (1, *self.shape)
        return math.lcm(1, *(t.group(shape) for t in self.transforms))


@dataclass(frozen=True)
class _RawTensor:
    """A tensor info as the file states it (validated)."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    file: Path
    start: int
    end: int


# --------------------------------------------------------------------------- finding files


def is_gguf_source(source: str) -> bool:
    """Whether ``source`` names a GGUF file (existing or not), or a folder without
    ``config.json`` that holds ``.gguf`` files (cheap: names only)."""
    path = Path(source).expanduser()
    if path.suffix.lower() == SUFFIX and not path.is_dir():
        return True  # a missing one too: the opener then says so
    if path.is_dir() and not (path / "config.json").exists():
        return any(p.suffix.lower() == SUFFIX for p in path.iterdir())
    return False


def gguf_files(source: str | os.PathLike[str]) -> list[Path]:
    """The files of the GGUF checkpoint ``source`` names: one file, or every file of a
    split in order; CheckpointError when the choice is ambiguous or a split is incomplete."""
    path = Path(source).expanduser().absolute()
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
        # an mmproj companion holds a vision/audio encoder, not the model
        models = [p for p in found if not p.name.lower().startswith("mmproj")]
        firsts = [
            p for p in models if not SPLIT.match(p.name) or SPLIT.match(p.name)["no"] == "00001"
        ]
        if len(firsts) != 1:
            names = ", ".join(p.name for p in firsts[:6]) or "none"
            raise CheckpointError(
                f"the folder holds {len(firsts)} GGUF models ({names}); mobius needs exactly one",
                where=str(path),
                fix="pass the .gguf file itself: mobius build FOLDER/NAME.gguf OUT",
            )
        path = firsts[0]
    match = SPLIT.match(path.name)
    if match is None:
        return [path]
    count = int(match["count"])
    if match["no"] != "00001":
        raise CheckpointError(
            f"{path.name} is part {int(match['no'])} of a {count}-part split",
            where=str(path),
            fix=f"pass the first part, {match['stem']}-00001-of-{match['count']}.gguf",
        )
    if not 1 <= count <= MAX_SPLITS:
        raise CheckpointError(
            f"{path.name} claims a split into {count} parts (1..{MAX_SPLITS} expected)",
            where=str(path),
            fix=FIX_DAMAGED,
        )
    parts = [
        path.with_name(f"{match['stem']}-{i:05d}-of-{match['count']}.gguf")
        for i in range(1, count + 1)
    ]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise CheckpointError(
            f"the split misses {len(missing)} of its {count} parts ({', '.join(missing[:4])})",
            where=str(path.parent),
            fix="download every part of the split into the same folder",
        )
    return parts


# --------------------------------------------------------------------------- reading


class _Malformed(ValueError):
    """The file breaks a bound this module sets on the reader."""


@cache
def _reader_class() -> type:
    """:class:`gguf.GGUFReader` with every read bounds-checked and every loop capped.

    The overrides only check and then call the reader's own method: the parsing is the
    ``gguf`` package's.
    """
    import gguf

    array_type = int(gguf.GGUFValueType.ARRAY)
    itemsizes: dict[Any, int] = {}

    class BoundedReader(gguf.GGUFReader):
        def __init__(self, path: Path) -> None:
            self._elements = 0
            super().__init__(path, "r")

        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None):
            width = itemsizes.get(dtype) or itemsizes.setdefault(dtype, np.dtype(dtype).itemsize)
            end = int(offset) + width * int(count)
            if offset < 0 or end > self.data.size:
                raise _Malformed(
                    f"it claims {end - int(offset)} bytes at offset {int(offset)}, past the end "
                    f"of the {self.data.size}-byte file (truncated, or a length that lies)"
                )
            return super()._get(offset, dtype, count, override_order)

        def _get_field_parts(self, orig_offs: int, raw_type: int):
            if int(raw_type) == array_type:
                item_type = int(self._get(orig_offs, np.uint32)[0])
                count = int(self._get(orig_offs + 4, np.uint64)[0])
                if item_type == array_type:
                    raise _Malformed(f"a metadata array at offset {orig_offs} holds arrays")
                self._elements += count
                if count > self.data.size - orig_offs or self._elements > MAX_ARRAY_ELEMENTS:
                    raise _Malformed(
                        f"a metadata array at offset {orig_offs} claims {count} elements "
                        f"(at most {MAX_ARRAY_ELEMENTS} in all, each at least one byte)"
                    )
                try:
                    scalar = self.gguf_scalar_to_np.get(gguf.GGUFValueType(item_type))
                except ValueError:
                    scalar = None  # the reader's own branch names the unknown type
                if scalar is not None:
                    # One view of the whole array instead of the reader's one per element
                    # (1M scores: 45 s and 700 MB as elements). contents() flattens the
                    # parts it indexes, so one part holding every value reads the same.
                    head = self._get(orig_offs, np.uint32)
                    length = self._get(orig_offs + 4, np.uint64)
                    values = self._get(orig_offs + 12, scalar, count)
                    kinds = [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType(item_type)]
                    return 12 + int(values.nbytes), [head, length, values], [2], kinds
            return super()._get_field_parts(orig_offs, raw_type)

        def _build_fields(self, offs: int, count: int) -> int:
            count = int(count)
            if count > MAX_KEYS or count * 13 > len(self.data) - offs:
                raise _Malformed(f"it claims {count} metadata keys (at most {MAX_KEYS})")
            return super()._build_fields(offs, count)

        def _build_tensor_info(self, offs: int, count: int):
            count = int(count)
            if count > MAX_TENSORS or count * 24 > len(self.data) - offs:
                raise _Malformed(f"it claims {count} tensors (at most {MAX_TENSORS})")
            return super()._build_tensor_info(offs, count)

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            for field in fields:
                _, name, n_dims, dims, raw_type, _ = field.parts
                label = _short(bytes(name).decode("utf-8", "replace"))
                if int(n_dims[0]) > MAX_DIMS:
                    raise _Malformed(f"tensor {label} has {int(n_dims[0])} dimensions (at most 4)")
                try:
                    qtype = gguf.GGMLQuantizationType(int(raw_type[0]))
                except ValueError:
                    raise _Malformed(
                        f"tensor {label} has unknown type {int(raw_type[0])} (gguf "
                        f"{_gguf_version()} knows {len(gguf.GGMLQuantizationType)} types)"
                    ) from None
                size = math.prod(int(d) for d in dims)
                if qtype not in gguf.GGML_QUANT_SIZES:
                    raise _Malformed(
                        f"tensor {label} has type {qtype.name}, of no known block size"
                    )
                block, type_size = gguf.GGML_QUANT_SIZES[qtype]
                if size * type_size // block > len(self.data) or (
                    len(dims) and int(dims[0]) % block
                ):
                    raise _Malformed(
                        f"tensor {label} of type {qtype.name} and shape {[int(d) for d in dims]} "
                        "does not fit the file (or its row is not a whole number of blocks)"
                    )
            super()._build_tensors(start_offs, fields)

    return BoundedReader


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:  # pragma: no cover - imported, so installed
        return "?"


@cache
def _dequantizable(ggml_type: str) -> bool:
    """Whether the installed ``gguf`` package dequantizes ``ggml_type`` in numpy."""
    import gguf

    qtype = gguf.GGMLQuantizationType[ggml_type]
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    try:
        gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _value(field: Any) -> Any:
    """A metadata field's value in Python; a float32 scalar as the shortest decimal that
    rounds to it (``1e-06``, the value the converter was given, not 9.99999997e-07)."""
    import gguf

    value = field.contents()
    if list(field.types) == [gguf.GGUFValueType.FLOAT32]:
        return float(str(np.float32(value)))
    return value


def read_gguf(path: Path) -> tuple[dict[str, Any], list[_RawTensor]]:
    """(metadata key → Python value, tensor infos) of one GGUF file, validated.

    The reader's memory map is dropped before returning: tensor data is read later with
    plain file reads.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError("GGUF file not found", where=str(path), fix="check the path")
    size = path.stat().st_size
    if size < 24:
        raise CheckpointError(
            f"{path.name} is {size} bytes, too short for a GGUF header",
            where=str(path),
            fix=FIX_DAMAGED,
        )
    try:
        reader = _reader_class()(path)
        if reader.byte_order != "I":
            raise _Malformed("it is big-endian; mobius reads little-endian GGUF files")
        metadata = {
            key: _value(field)
            for key, field in reader.fields.items()
            if not key.startswith("GGUF.")
        }
        raw = [
            _RawTensor(
                name=t.name,
                ggml_type=t.tensor_type.name,
                shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                file=path.absolute(),
                start=int(t.data_offset),
                end=int(t.data_offset) + int(t.n_bytes),
            )
            for t in reader.tensors
        ]
        alignment = int(reader.alignment)
        del reader
    except (_Malformed, ValueError, KeyError, IndexError, OverflowError, TypeError,
            UnicodeDecodeError, RecursionError, MemoryError) as exc:  # fmt: skip
        what = str(exc) or type(exc).__name__
        if isinstance(exc, UnicodeDecodeError):
            what = "a string in it is not UTF-8"
        elif isinstance(exc, KeyError) and "Duplicate" in str(exc):
            what = (
                f"a metadata key is given twice ({_short(str(exc.args[0] if exc.args else exc))})"
            )
        raise CheckpointError(
            f"{path.name} is not a readable GGUF file: {what}", where=str(path), fix=FIX_DAMAGED
        ) from None
    _check_tensors(path, raw, alignment)
    return metadata, raw


def _check_tensors(path: Path, tensors: list[_RawTensor], alignment: int) -> None:
    previous: _RawTensor | None = None
    for t in sorted(tensors, key=lambda t: (t.start, t.end)):
        where = f"{path}, tensor {_short(t.name)}"
        if t.ggml_type not in _PLAIN and not _dequantizable(t.ggml_type):
            raise CheckpointError(
                f"tensor type {t.ggml_type} cannot be dequantized by gguf {_gguf_version()}",
                where=where,
                fix="convert the model with another quantization type (e.g. Q8_0 or Q4_K_M), "
                "or upgrade the gguf package",
            )
        if t.start % alignment:
            raise CheckpointError(
                f"tensor data at offset {t.start} is not aligned to {alignment} bytes",
                where=where,
                fix=FIX_DAMAGED,
            )
        if previous is not None and t.start < previous.end and t.end > t.start:
            raise CheckpointError(
                f"tensor data overlaps tensor {_short(previous.name)}",
                where=where,
                fix=FIX_DAMAGED,
            )
        if t.end > t.start:
            previous = t


# --------------------------------------------------------------------------- the checkpoint


class GGUFCheckpoint(Checkpoint):
    """The tensors of a GGUF file (or split) under HF names, and generated side files.

    ``root`` is the (first) GGUF file. :meth:`file` serves the files made from the
    metadata (``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``,
    ``generation_config.json``), written to a private temporary folder that is removed
    with the checkpoint. :attr:`companion` is the ``mmproj`` file read with the model
    (None: the model file alone); :attr:`companion_note` says why one found beside the
    model was not read ("" when there is nothing to say).
    """

    companion: Path | None = None
    companion_note: str = ""

    def __init__(
        self,
        root: Path,
        source: SourceInfo,
        raw_config: dict[str, Any],
        tensors: Mapping[str, GGUFTensorInfo],
        generated: Mapping[str, bytes],
        metadata: Mapping[str, Any],
    ) -> None:
        super().__init__(root, source, raw_config, {})
        self.tensors = MappingProxyType(dict(tensors))  # type: ignore[assignment]
        self.metadata = MappingProxyType(dict(metadata))
        self._side = tempfile.TemporaryDirectory(prefix="mobius-gguf-")
        weakref.finalize(self, self._side.cleanup)
        self._side_files: dict[str, Path] = {}
        for name, data in generated.items():
            target = Path(self._side.name) / name
            target.write_bytes(data)
            self._side_files[name] = target

    def __repr__(self) -> str:
        return f"GGUFCheckpoint({str(self.root)!r}, {len(self.tensors)} tensors)"

    def file(self, relative: str) -> Path | None:
        return self._side_files.get(relative)

    def read(self, name: str) -> np.ndarray:
        info = self.info(name)
        return self._rows(info, 0, info.rows).reshape(info.shape)  # type: ignore[arg-type]

    def read_chunks(self, name: str, begin: int, end: int, step: int) -> Iterator[np.ndarray]:
        info: GGUFTensorInfo = self.info(name)  # type: ignore[assignment]
        count = math.prod(info.shape)
        if not 0 <= begin <= end <= count or step < 1:
            raise ValueError(f"bad element range {begin}:{end} (step {step}) of {count} elements")
        return self._chunks(info, begin, end, step)

    def _chunks(
        self, info: GGUFTensorInfo, begin: int, end: int, step: int
    ) -> Iterator[np.ndarray]:
        cols, group = info.row_length, info.group
        per_piece = max(group, (max(1, step // cols) // group) * group)
        row = (begin // cols) // group * group
        while row * cols < end:
            stop = min(row + per_piece, info.rows)
            flat = self._rows(info, row, stop).reshape(-1)
            base = row * cols
            lo, hi = max(begin, base) - base, min(end, base + flat.size) - base
            for pos in range(lo, hi, step):
                yield flat[pos : min(pos + step, hi)]
            row = stop

    def _rows(self, info: GGUFTensorInfo, first: int, stop: int) -> np.ndarray:
        """Served rows ``first:stop`` (whole groups), dequantized and transformed."""
        import gguf

        cols = info.row_length
        qtype = gguf.GGMLQuantizationType[info.ggml_type]
        stored = math.prod(info.stored_shape[:-1]) if len(info.stored_shape) > 1 else 1
        dtype = _NUMPY[info.dtype_name]
        out = np.zeros((stop - first, cols), dtype=dtype)
        have = max(0, min(stop, stored) - first)
        if have:
            raw = self._raw_rows(info, first, first + have)
            if info.ggml_type in _PLAIN:
                out[:have] = raw.view(dtype).reshape(have, cols)
            else:
                out[:have] = gguf.quants.dequantize(raw, qtype)
            del raw
        for transform in info.transforms:
            out = transform.apply(out, info.stored_shape)
        return out

    def kept_scheme(self, name: str, *, target: str, gather: bool, errors: Any = None) -> Any:
        """How a build that keeps the file's quantization stores tensor ``name``: a
        :class:`mobius.weights.quantize.QuantScheme`, or why it stays float (a str).

        ``gather``: a GatherBlockQuantized reads it (an embedding, a tied head), which
        takes no float zero points. ``errors`` (a ``WeightErrors``) records the weight
        error of the ``--target cpu`` approximations (:data:`APPROXIMATED`).
        """
        from mobius.weights.quantize import QuantScheme

        info = self.tensors.get(name)
        if not isinstance(info, GGUFTensorInfo):
            return "not a tensor of the GGUF file"
        kind = info.ggml_type
        if kind in _PLAIN:
            return f"stored {kind}"
        if len(info.shape) < 2:
            return f"{kind}: {len(info.shape)}-D (dequantized)"
        if not all(t.moves_rows for t in info.transforms):
            return f"{kind}: a transform changes its values (dequantized)"
        form = STORED_FORMS.get(kind)
        if form is not None and not form[2]:
            return QuantScheme(bits=form[0], block_size=form[1], symmetric=True)
        if kind in EXACT_CPU and target == "cpu" and not gather and form is not None:
            return QuantScheme(
                bits=form[0], block_size=form[1], symmetric=True, block_correction=True
            )
        if kind in APPROXIMATED and target == "cpu":
            bits, block = CPU_FORM
            return QuantScheme(
                bits=bits, block_size=block, symmetric=False, errors=errors, error_key=kind
            )
        if form is not None and not gather:
            return QuantScheme(
                bits=form[0], block_size=form[1], symmetric=False, float_zero_points=True
            )
        if form is not None:
            return (
                f"{kind} read by GatherBlockQuantized, which takes no float zero points "
                "(dequantized; --target cpu stores it as int8 blocks)"
            )
        if kind in APPROXIMATED:
            return (
                f"{kind} has no exact form: onnxruntime's MatMulNBits takes float zero points "
                "in 2 and 4 bits only (dequantized; --target cpu stores it as int8 blocks)"
            )
        return (
            f"{kind} has no MatMulNBits / GatherBlockQuantized form (dequantized; "
            "--quant int4|int8 requantizes it)"
        )

    def stored_quantized(self, name: str, scheme: Any, scale_dtype: Any) -> Any:
        """A reader ``(r0, r1) -> mobius.weights.quantize.QuantizedRows`` of tensor
        ``name``'s own blocks when they are exactly ``scheme`` (:data:`STORED_FORMS`), else
        None. The scales (and float zero points) are stored in ``scale_dtype`` (float32:
        exact; float16: one rounding, exact for Q8_0 / Q4_0 / Q5_0's fp16 scales)."""
        info = self.tensors.get(name)
        if not isinstance(info, GGUFTensorInfo):
            return None
        form = STORED_FORMS.get(info.ggml_type)
        correction = bool(getattr(scheme, "block_correction", False))
        wanted = (scheme.bits, scheme.block_size, scheme.float_zero_points or correction)
        if (
            form != wanted
            or scheme.symmetric != (not form[2] or correction)
            or (correction and scheme.float_zero_points)
            or not all(t.moves_rows for t in info.transforms)
            or len(info.shape) < 2
            or np.dtype(scale_dtype) not in (np.dtype(np.float32), np.dtype(np.float16))
        ):
            return None
        dtype = np.dtype(scale_dtype)
        return lambda first, stop: self._stored_rows(info, dtype, first, stop, correction)

    def _stored_rows(
        self, info: GGUFTensorInfo, dtype: np.dtype, first: int, stop: int, correction: bool
    ) -> Any:
        """Rows ``first:stop`` as :data:`STORED_FORMS` blocks (``correction``: symmetric
        levels plus block corrections, :data:`EXACT_CPU`): whole groups of rows are read
        and decoded, moved by the tensor's transforms, then cut to the range."""
        from mobius.weights.quantize import QuantizedRows

        group = info.group
        g0, g1 = first // group * group, min(-(-stop // group) * group, info.rows)
        stored = math.prod(info.stored_shape[:-1])
        have = max(0, min(g1, stored) - g0)
        parts = _decode_blocks(info, self._raw_rows(info, g0, g0 + have), dtype, correction)
        if g1 - g0 > have:  # pad_rows: rows past the stored ones read as zeros
            parts = [
                np.concatenate([p, np.zeros((g1 - g0 - have, *p.shape[1:]), p.dtype)])
                for p in parts
            ]
        for transform in info.transforms:
            parts = [
                transform.apply(p.reshape(len(p), -1), info.stored_shape).reshape(p.shape)
                for p in parts
            ]
        packed, scales, zero_points = (p[first - g0 : stop - g0] for p in parts)
        if correction:
            return QuantizedRows(
                packed=packed, scales=scales, zero_points=None, correction=zero_points
            )
        if info.ggml_type in ("Q4_1", "Q4_K"):
            return QuantizedRows(packed=packed, scales=scales, zero_points=zero_points)
        return QuantizedRows(packed=packed, scales=scales, zero_points=None)

    def _raw_rows(self, info: GGUFTensorInfo, first: int, stop: int) -> np.ndarray:
        """The stored bytes of rows ``first:stop`` (``[rows, row bytes]`` uint8)."""
        import gguf

        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[info.ggml_type]]
        row_bytes = info.row_length * type_size // block
        raw = np.empty((stop - first, row_bytes), dtype=np.uint8)
        _read_exact(info, info.start + first * row_bytes, memoryview(raw.reshape(-1)))
        return raw


def _decode_blocks(
    info: GGUFTensorInfo, raw: np.ndarray, dtype: np.dtype, correction: bool = False
) -> list[np.ndarray]:
    """[packed, scales, zero points] of the ``[rows, row bytes]`` blocks ``raw`` of a
    :data:`STORED_FORMS` tensor (zero points: float, or zeros for a symmetric type);
    ``correction`` (a type with a minimum): [packed, scales, corrections], the levels
    read as symmetric (``d · (q − 8) + c``, ``c = 8·d − min``: one float32 rounding)."""
    import gguf

    from mobius.weights.quantize import pack_levels

    kind = info.ggml_type
    qtype = gguf.GGMLQuantizationType[kind]
    bits, block, float_zp = STORED_FORMS[kind]
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    rows, cols = raw.shape[0], info.row_length
    blocks = raw.reshape(rows, -1, type_size)
    unit = blocks.copy()
    for at, data in _UNIT_SCALE[kind]:
        unit[..., at : at + len(data)] = np.frombuffer(data, np.uint8)
    levels = gguf.quants.dequantize(unit.reshape(rows, -1), qtype).reshape(rows, cols)
    if not float_zp:
        levels = levels + np.float32(1 << (bits - 1))
    levels = levels.astype(np.uint8)

    def half(at: int) -> np.ndarray:
        return blocks[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)

    minimum = None
    if kind == "Q6_K":
        sub = blocks[..., 192:208].view(np.int8).astype(np.float32)
        scale = (half(208)[..., None] * sub).reshape(rows, -1)
    elif kind == "Q4_K":
        sc, mn = gguf.quants.Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12))
        scale = (half(0)[..., None] * sc.reshape(rows, -1, 8)).reshape(rows, -1)
        minimum = (half(2)[..., None] * mn.reshape(rows, -1, 8)).reshape(rows, -1)
    else:
        scale = half(0)
        if kind == "Q4_1":
            minimum = -half(2)
    if correction:
        if minimum is None:
            raise ValueError(f"{kind} has no block minimum to correct")
        packed = pack_levels(levels, bits).reshape(rows, cols // block, -1)
        fix = np.float32(1 << (bits - 1)) * scale - minimum
        return [packed, scale.astype(dtype), fix.astype(dtype)]
    if minimum is None:
        zero = np.zeros(scale.shape, dtype)
    else:  # d·q − min = d · (q − min / d)
        zero = np.divide(minimum, scale, out=np.ones_like(scale), where=scale != 0)
        flat = scale == 0  # every value is −min: levels 0, scale min, zero point 1
        if flat.any():
            levels = levels.reshape(rows, -1, block)
            levels[flat] = 0
            levels = levels.reshape(rows, cols)
            scale = np.where(flat, minimum, scale)
    packed = pack_levels(levels, bits).reshape(rows, cols // block, -1)
    return [packed, scale.astype(dtype), zero.astype(dtype)]


def _read_exact(info: GGUFTensorInfo, offset: int, buffer: memoryview) -> None:
    where = f"{info.file}, tensor {info.gguf_name!r}"
    try:
        with open(info.file, "rb", buffering=0) as f:
            f.seek(offset)
            filled = 0
            while filled < len(buffer):
                n = f.readinto(buffer[filled:])
                if not n:
                    raise CheckpointError(
                        f"file ended at byte {offset + filled} inside the tensor's data",
                        where=where,
                        fix="the file changed or shrank since it was opened; " + FIX_DAMAGED,
                    )
                filled += n
    except OSError as exc:
        raise CheckpointError(
            f"cannot read tensor data: {exc.strerror or exc}",
            where=where,
            fix="check that the file still exists and is readable",
        ) from exc


# --------------------------------------------------------------------------- opening


NO_COMPANION = "none"
"""``--mmproj none``: build the model file alone, whatever lies beside it."""
COMPANION_PREFIX = "mmproj"
"""llama.cpp's name for a model's encoder file (``mmproj-MODEL-f16.gguf``)."""


def companion_file(source: str, files: list[Path], named: str | None) -> tuple[Path | None, str]:
    """(the companion GGUF file of the model ``files`` or None, a note for the user).

    ``named`` is what the user passed (``--mmproj FILE``, or :data:`NO_COMPANION`); with
    none, the one ``mmproj*.gguf`` file in the model's folder (SRC itself when it is a
    folder) is the companion; several are left alone, saying so.
    """
    if named is not None and named.strip().lower() == NO_COMPANION:
        return None, ""
    if named is not None:
        path = Path(named).expanduser().absolute()
        fix = "pass the mmproj .gguf file llama.cpp's convert_hf_to_gguf.py --mmproj wrote"
        if not path.is_file():
            raise CheckpointError("mmproj file not found", where=str(path), fix=fix)
        if path.suffix.lower() != SUFFIX:
            raise CheckpointError("the mmproj file is not a .gguf file", where=str(path), fix=fix)
        if any(path.resolve() == f.resolve() for f in files):
            raise CheckpointError(
                "the mmproj file is the model file itself", where=str(path), fix=fix
            )
        return path, ""
    folder = Path(source).expanduser().absolute()
    if not folder.is_dir():
        folder = files[0].parent
    found = sorted(
        p
        for p in folder.iterdir()
        if p.suffix.lower() == SUFFIX
        and p.name.lower().startswith(COMPANION_PREFIX)
        and p.is_file()
        and p not in files
    )
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:4])
        return None, (
            f"{len(found)} mmproj files beside the model ({names}): none read, the package "
            "holds the model file's parts only; choose one with --mmproj FILE"
        )
    return (found[0], "") if found else (None, "")


def open_gguf(
    source: str, host: PluginHost | None, *, companion: str | None = None
) -> GGUFCheckpoint:
    """Open the GGUF checkpoint ``source`` names, translated by the family of its
    architecture (``host.gguf_translation``), with its companion file when it has one
    (``companion``: the file the user named, see :func:`companion_file`; the family then
    answers ``host.gguf_companion_translation``)."""
    from mobius.checkpoint.gguf_tokenizer import side_files, special_ids
    from mobius.checkpoint.local import BackgroundHashes
    from mobius.records import GGUFCompanion

    files = gguf_files(source)
    first = files[0]
    metadata, tensors = read_gguf(first)
    for part in files[1:]:
        tensors += read_gguf(part)[1]
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise CheckpointError(
            "the GGUF file names no general.architecture",
            where=str(first),
            fix="convert the model again with llama.cpp's convert_hf_to_gguf.py",
        )
    shapes = _shapes(tensors)
    if host is None:
        raise CheckpointError(
            "a GGUF file needs the plugin host to find the family of its architecture",
            where=str(first),
            fix="open it through PluginHost.open_checkpoint (mobius build does)",
        )
    view = MappingProxyType(metadata)
    mmproj, note = companion_file(source, files, companion)
    answer = None
    if mmproj is not None and companion is None:
        try:  # found, not named: a damaged one is left alone, saying so
            read_gguf(mmproj)
        except CheckpointError as exc:
            note = f"{mmproj.name} beside the model not read: {exc.what}"
            mmproj = None
    if mmproj is not None:
        extra_meta, extra = read_gguf(mmproj)
        both = [t.name for t in extra if t.name in shapes]
        if both:
            raise CheckpointError(
                f"tensor {_short(both[0])} is in both the model file and its mmproj file",
                where=str(mmproj),
                fix="pass the mmproj file made for this model (--mmproj FILE), or "
                "--mmproj none for the model file alone",
            )
        record = GGUFCompanion(
            file=str(mmproj),
            metadata=MappingProxyType(extra_meta),
            tensors=MappingProxyType(_shapes(extra)),
        )
        answer = host.gguf_companion_translation(
            architecture, view, MappingProxyType(shapes), record
        )
        if answer is None and companion is not None:
            raise CheckpointError(
                f"no installed plugin reads an mmproj file with GGUF architecture {architecture!r}",
                where=str(mmproj),
                fix="drop --mmproj (the package then holds the model file's parts only), "
                "or install a plugin version that reads it",
            )
        if answer is None:
            note = (
                f"{mmproj.name} beside the model not read: the {architecture!r} family "
                "reads no mmproj files (the package holds the model file's parts only)"
            )
            mmproj = None
        else:
            tensors = tensors + extra
            files = [*files, mmproj]
    if answer is None:
        answer = host.gguf_translation(architecture, view, MappingProxyType(shapes))
    plugin, translation = answer
    where = f"{first} (architecture {architecture!r}, plugin {plugin})"
    if mmproj is not None:
        where = f"{first} with {mmproj.name} (architecture {architecture!r}, plugin {plugin})"
    infos = _translate_tensors(tensors, translation.tensors, where)
    config = dict(translation.config)
    for key, value in special_ids(view).items():
        config.setdefault(key, value)
    info = SourceInfo(
        source=source,
        kind="gguf",
        revision=None,
        commit=None,
        files=BackgroundHashes({p.name: p for p in files}),
    )
    checkpoint = GGUFCheckpoint(
        first, info, config, infos, side_files(view, where=str(first)), metadata
    )
    checkpoint.companion = mmproj
    checkpoint.companion_note = note
    return checkpoint


def _shapes(tensors: list[_RawTensor]) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape; CheckpointError for a name stored twice."""
    shapes: dict[str, tuple[int, ...]] = {}
    for t in tensors:
        if t.name in shapes:
            raise CheckpointError(
                f"tensor {_short(t.name)} is stored twice",
                where=str(t.file),
                fix=FIX_DAMAGED,
            )
        shapes[t.name] = t.shape
    return shapes


def _translate_tensors(
    tensors: list[_RawTensor], names: Mapping[str, Any], where: str
) -> dict[str, GGUFTensorInfo]:
    from mobius.records import GGUFTensor

    unknown = [t.name for t in tensors if t.name not in names]
    if unknown:
        shown = ", ".join(_short(n) for n in unknown[:6]) + (" …" if len(unknown) > 6 else "")
        raise CheckpointError(
            f"{len(unknown)} tensor(s) of the GGUF file are not ones the family knows: {shown}",
            where=where,
            fix="use a GGUF file converted by llama.cpp for this architecture, or a newer "
            "version of the family plugin",
        )
    out: dict[str, GGUFTensorInfo] = {}
    for t in tensors:
        target = names[t.name]
        if target is None:
            continue
        if isinstance(target, str):
            target = GGUFTensor(target)
        shape = t.shape
        for transform in target.transforms:
            shape = transform.out_shape(shape, f"{where}, tensor {t.name!r}")
        if target.name in out:
            raise CheckpointError(
                f"tensors {out[target.name].gguf_name!r} and {t.name!r} both map to "
                f"{target.name!r}",
                where=where,
                fix="this is a bug in the family plugin's GGUF translation; report it",
            )
        out[target.name] = GGUFTensorInfo(
            name=target.name,
            gguf_name=t.name,
            ggml_type=t.ggml_type,
            stored_shape=t.shape,
            shape=shape,
            file=t.file,
            start=t.start,
            end=t.end,
            transforms=tuple(target.transforms),
        )
    return out
