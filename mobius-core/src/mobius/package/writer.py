"""Writing a package: an atomic, streamed writer (see :mod:`mobius.package`).

Why the writer lays out external data itself instead of ``ir.save(...,
external_data=...)``: it takes one lazy tensor at a time, writes it, hashes it and
drops it before the next, and reports each tensor to the progress callback. A
tensor larger than ``chunk_bytes`` whose object offers ``iter_chunks(max_bytes)``
(:class:`mobius.weights.PlannedTensor` does, for streamable weight-plan
expressions) is written chunk by chunk and never held whole, so peak memory is
about one chunk plus the largest tensor that cannot be streamed. Everything is
written to a hidden sibling folder and renamed into place at the end, so a failed
build never leaves a half package.

What OUT may be, what ``force`` may replace, and how siblings left by a killed
writer are cleaned up or restored is :mod:`mobius.outdir`'s policy. A full disk
(or quota, or a file size limit) becomes a :class:`PackageError` naming the file
being written.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

import numpy as np
import onnx_ir as ir

from mobius import outdir
from mobius.errors import MobiusError, PackageError
from mobius.outdir import remove_stale_siblings as remove_stale_siblings
from mobius.package.manifest import (
    _COMPONENT_NAME,
    ALIGNMENT,
    DATA_NAME,
    FORMAT_VERSION,
    INLINE_LIMIT,
    MANIFEST_NAME,
    MODEL_NAME,
    SHARED_NAME,
    _sha256_size,
)
from mobius.package.stamp import STAMP_NAME
from mobius.records import RuntimeFile

_RESERVED_KEYS = ("format_version", "components", "files")
_FREE_SPACE = "free space or choose another OUT"
_NO_ROOM = {
    errno.ENOSPC: ("no space left on device", _FREE_SPACE),
    errno.EDQUOT: ("disk quota exceeded", _FREE_SPACE),
    errno.EFBIG: (
        "file too large for the file system",
        "choose an OUT on a file system without a small file size limit (not FAT32)",
    ),
}
"""errno of a write that failed for lack of room -> (what, fix)."""
CHUNK_BYTES = 64 * 1024 * 1024
"""Bytes per chunk when a tensor is streamed (and the size above which it is)."""
_chunk_bytes = contextvars.ContextVar("mobius_package_chunk_bytes", default=CHUNK_BYTES)
"""The ``chunk_bytes`` of the running :func:`write_package` (read by :func:`_write_tensor`)."""
# Tensors whose bytes numpy gives directly (no sub-byte packing).
_NUMPY_BYTES = {
    ir.DataType.FLOAT,
    ir.DataType.FLOAT16,
    ir.DataType.BFLOAT16,
    ir.DataType.DOUBLE,
    ir.DataType.INT64,
    ir.DataType.INT32,
    ir.DataType.INT16,
    ir.DataType.INT8,
    ir.DataType.UINT8,
    ir.DataType.BOOL,
}


class _Progress(Protocol):
    """The part of :class:`mobius.progress.BuildProgress` the writer calls."""

    def component_started(self, name: str, n_tensors: int) -> None: ...
    def tensor_written(self, component: str, name: str, nbytes: int) -> None: ...
    def component_finished(self, name: str) -> None: ...
    def message(self, text: str) -> None: ...


def write_package(
    out: str | os.PathLike[str],
    *,
    components: Mapping[str, ir.Model],
    manifest: Mapping[str, Any],
    runtime_files: Sequence[RuntimeFile] = (),
    force: bool = False,
    progress: _Progress | None = None,
    inline_limit: int = INLINE_LIMIT,
    chunk_bytes: int = CHUNK_BYTES,
) -> Path:
    """Write a complete package to ``out`` atomically; return its path.

    Initializers of ``inline_limit`` bytes or more go to external data, one at a
    time; smaller ones stay inside ``model.onnx`` (see :func:`_inline`). Tensors of
    more than ``chunk_bytes`` that can stream (``iter_chunks``) are written in chunks
    of at most ``chunk_bytes`` (see :func:`_write_tensor`).

    ``manifest`` holds the caller's fields (model_type, task, dtype, target,
    contract, source, versions); this adds ``format_version``, ``components``
    ({name: {path, data, sha256, data_sha256, size (both files), model_size, data_size}})
    and ``files``
    ({relative path: {sha256, size}} of runtime files). The models are not
    changed: initializers get their lazy tensors back after saving.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    for key in _RESERVED_KEYS:
        if key in manifest:
            raise ValueError(f"manifest key {key!r} is written by write_package itself")
    out = outdir.check_package_out(out, force=force, notice=progress and progress.message)
    _check_names(components, runtime_files)
    outdir.make_parent(out)
    outdir.remove_stale_siblings(out, notice=progress and progress.message)
    with _room(out, "a temporary folder"):
        tmp = outdir.make_temp_sibling(out)
    try:
        entries = {}
        shared = _find_shared(components, inline_limit)
        for name, model in components.items():
            token = _chunk_bytes.set(chunk_bytes)
            try:
                entries[name] = _write_component(
                    tmp, out, name, model, progress, inline_limit, shared
                )
            finally:
                _chunk_bytes.reset(token)
        files = {}
        for rf in runtime_files:
            with _room(out, rf.path):
                files[rf.path] = _write_runtime_file(tmp, rf)
        full = {
            "format_version": FORMAT_VERSION,
            **{k: _jsonable(v) for k, v in manifest.items()},
            "components": entries,
            "files": files,
        }
        with _room(out, MANIFEST_NAME):
            (tmp / MANIFEST_NAME).write_text(
                json.dumps(full, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
            )
        _stamp(tmp)
        _move_into_place(tmp, out, progress and progress.message, force=force)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        cause = _mobius_cause(exc)
        if cause is not None and cause is not exc:
            # a user-fixable error raised while a tensor was read (a checkpoint value a
            # transform refuses, a file that shrank) reaches the user as itself, not
            # wrapped in the serializer's error
            raise cause from None
        raise
    if progress is not None:
        progress.message(f"package written to {out}")
    return out


def _mobius_cause(exc: BaseException | None) -> MobiusError | None:
    """The first MobiusError in ``exc``'s cause / context chain (``exc`` itself first)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, MobiusError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _stamp(tmp: Path) -> None:
    """Check the written package (all but hashes: they were taken while writing) and stamp it.

    The stamp lets the first ``Pipeline.load`` skip hashing (see
    :mod:`mobius.package.stamp`). A package that fails a check is left unstamped;
    ``mobius verify`` and ``Pipeline.load`` then report its problems.
    """
    from mobius.package.checks import check_package

    check_package(tmp, trust_stamp=False, hash_files=False)


@contextlib.contextmanager
def _room(out: Path, relpath: str) -> Iterator[None]:
    """Turn "disk full" while writing ``relpath`` into a PackageError that names it.

    Other OSErrors pass through unchanged: they are not about room on OUT's disk.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        reason, fix = _NO_ROOM[exc.errno]
        raise PackageError(
            f"{reason} while writing {relpath}; the partial package was removed",
            where=str(out),
            fix=fix,
        ) from exc


def _check_names(components: Mapping[str, ir.Model], runtime_files: Sequence[RuntimeFile]) -> None:
    if not components:
        raise ValueError("a package needs at least one component")
    taken = {MANIFEST_NAME, STAMP_NAME}
    for name in components:
        if not _COMPONENT_NAME.fullmatch(name) or name in (".", ".."):
            raise ValueError(f"component name {name!r} is not a plain folder name")
        taken.add(name)
    seen: set[str] = set()
    for rf in runtime_files:
        parts = PurePosixPath(rf.path.replace("\\", "/")).parts
        if not parts or parts[0] in taken or rf.path in seen:
            raise PackageError(
                f"runtime file {rf.path!r} collides with the manifest, a component folder "
                "or another runtime file",
                where=rf.path,
                fix="rename the runtime file in the plugin's mobius_runtime_files",
            )
        seen.add(rf.path)


def _graph_initializers(model: ir.Model) -> list[ir.Value]:
    values: list[ir.Value] = []
    for graph in model.graphs():
        values.extend(v for v in graph.initializers.values() if v.const_value is not None)
    return values


@dataclasses.dataclass
class _Shared:
    """Tensors that two or more components plan identically (same ``share_key``), stored
    once: in ``SHARED_NAME`` of the first such component's folder, hard-linked into the
    others' (onnxruntime refuses external data outside a model's folder)."""

    tensors: dict[Any, ir.TensorProtocol]
    """share key -> the tensor to write (the first component's), in write order."""
    users: set[str]
    """Components that read at least one of them."""
    where: dict[Any, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """share key -> (offset, bytes) in the written file."""
    first: str | None = None
    """The component whose folder holds the file once it is written."""
    sha256: str = ""
    size: int = 0


def _share_key(tensor: ir.TensorProtocol) -> Any:
    key = getattr(tensor, "share_key", None)
    return key() if callable(key) else None


def _find_shared(components: Mapping[str, ir.Model], inline_limit: int) -> _Shared:
    """The external tensors planned identically in more than one component."""
    first: dict[Any, tuple[str, ir.TensorProtocol]] = {}
    users: dict[Any, set[str]] = {}
    for name, model in components.items():
        for value in _graph_initializers(model):
            if _inline(value.const_value, inline_limit):
                continue
            key = _share_key(value.const_value)
            if key is not None:
                first.setdefault(key, (name, value.const_value))
                users.setdefault(key, set()).add(name)
    keys = [key for key in first if len(users[key]) > 1]
    return _Shared(
        {key: first[key][1] for key in keys},
        set().union(*(users[key] for key in keys)),
    )


def _write_component(
    tmp: Path,
    out: Path,
    name: str,
    model: ir.Model,
    progress: _Progress | None,
    inline_limit: int,
    shared: _Shared,
) -> dict[str, Any]:
    folder = tmp / name
    with _room(out, name):
        folder.mkdir()
    model_path, data_path = folder / MODEL_NAME, folder / DATA_NAME
    values = [v for v in _graph_initializers(model) if not _inline(v.const_value, inline_limit)]
    keys = {id(v): _share_key(v.const_value) for v in values}
    own = [v for v in values if keys[id(v)] not in shared.tensors]
    writes_shared = name in shared.users and shared.first is None
    if progress is not None:
        progress.component_started(name, len(own) + (len(shared.tensors) if writes_shared else 0))
    originals: list[tuple[ir.Value, Any]] = []
    data_hash = hashlib.sha256()
    try:
        if name in shared.users:
            if writes_shared:
                _write_shared(folder, out, name, shared, progress)
            else:
                assert shared.first is not None
                _link(tmp / shared.first / SHARED_NAME, folder / SHARED_NAME, out, name, progress)
            for value in values:
                key = keys[id(value)]
                if key in shared.tensors:
                    offset, nbytes = shared.where[key]
                    originals.append((value, value.const_value))
                    value.const_value = _external(value, SHARED_NAME, offset, nbytes, folder)
        with _room(out, f"{name}/{DATA_NAME}"), data_path.open("wb") as f:
            offset = 0
            for value in own:
                tensor = value.const_value
                offset, nbytes = _append(f, tensor, data_hash, offset)
                originals.append((value, tensor))
                value.const_value = _external(value, DATA_NAME, offset, nbytes, folder)
                offset += nbytes
                if progress is not None:
                    progress.tensor_written(name, value.name or "", nbytes)
        with _room(out, f"{name}/{MODEL_NAME}"):
            ir.save(model, model_path)
    finally:
        for value, tensor in originals:
            value.const_value = tensor
    if progress is not None:
        progress.component_finished(name)
    model_sha, model_size = _sha256_size(model_path)
    data_size = data_path.stat().st_size
    entry: dict[str, Any] = {
        "path": f"{name}/{MODEL_NAME}",
        "data": f"{name}/{DATA_NAME}",
        "sha256": model_sha,
        "data_sha256": data_hash.hexdigest(),
        "size": model_size + data_size,
        "model_size": model_size,
        "data_size": data_size,
    }
    if name in shared.users:
        entry["shared"] = {
            "path": f"{name}/{SHARED_NAME}",
            "sha256": shared.sha256,
            "size": shared.size,
        }
        if shared.first != name:
            entry["shared"]["same_file_as"] = f"{shared.first}/{SHARED_NAME}"
        entry["size"] += shared.size
    return entry


def _append(f: IO[bytes], tensor: ir.TensorProtocol, digest: Any, offset: int) -> tuple[int, int]:
    """Pad ``f`` (at ``offset``) to :data:`ALIGNMENT`, append ``tensor``; return its
    (offset, bytes)."""
    pad = (-offset) % ALIGNMENT
    if pad:
        f.write(b"\0" * pad)
        digest.update(b"\0" * pad)
    return offset + pad, _write_tensor(f, tensor, digest)


def _external(
    value: ir.Value, location: str, offset: int, nbytes: int, folder: Path
) -> ir.ExternalTensor:
    tensor = value.const_value
    assert tensor is not None
    return ir.ExternalTensor(
        location,
        offset,
        nbytes,
        tensor.dtype,
        shape=tensor.shape,
        name=value.name or tensor.name or "",
        base_dir=folder,
    )


def _write_shared(
    folder: Path, out: Path, name: str, shared: _Shared, progress: _Progress | None
) -> None:
    """Write every shared tensor into ``folder``/:data:`SHARED_NAME` (streamed, hashed)."""
    digest = hashlib.sha256()
    with _room(out, f"{name}/{SHARED_NAME}"), (folder / SHARED_NAME).open("wb") as f:
        offset = 0
        for key, tensor in shared.tensors.items():
            offset, nbytes = _append(f, tensor, digest, offset)
            shared.where[key] = (offset, nbytes)
            offset += nbytes
            if progress is not None:
                progress.tensor_written(name, tensor.name or "", nbytes)
    shared.first, shared.sha256 = name, digest.hexdigest()
    shared.size = (folder / SHARED_NAME).stat().st_size


def _link(source: Path, dest: Path, out: Path, name: str, progress: _Progress | None) -> None:
    """Hard-link ``source`` (a file this writer wrote in its temporary folder) to ``dest``;
    copy it where the file system refuses hard links (FAT, some network shares)."""
    try:
        os.link(source, dest, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _NO_ROOM:
            raise PackageError(
                f"{_NO_ROOM[exc.errno][0]} while linking {name}/{SHARED_NAME}; the partial "
                "package was removed",
                where=str(out),
                fix=_NO_ROOM[exc.errno][1],
            ) from exc
        if progress is not None:
            progress.message(
                f"{name}/{SHARED_NAME}: the file system refuses hard links "
                f"({exc.strerror or exc}); copied instead (stored twice on disk)"
            )
        with _room(out, f"{name}/{SHARED_NAME}"):
            shutil.copyfile(source, dest)


def _inline(tensor: ir.TensorProtocol, limit: int) -> bool:
    """Whether a tensor stays inside ``model.onnx`` instead of the external data file.

    onnxruntime must read small constants (axes, shapes, scalars) while it infers
    shapes at load time, before external data is mapped; it refuses them when they
    are external. Anything under ``limit`` bytes is kept inline.
    """
    return tensor.size * tensor.dtype.itemsize < limit


def _write_tensor(f: IO[bytes], tensor: ir.TensorProtocol, digest: Any) -> int:
    """Append one tensor's bytes to ``f`` and ``digest``; return its size.

    Streamed in chunks when it is larger than ``chunk_bytes`` (of the running
    :func:`write_package`) and its object has ``iter_chunks(max_bytes)`` returning an
    iterator (not None) of numpy arrays or bytes-like objects; otherwise materialized
    whole.
    """
    chunk_bytes = _chunk_bytes.get()
    expected = tensor.size * tensor.dtype.itemsize if tensor.dtype in _NUMPY_BYTES else None
    stream = getattr(tensor, "iter_chunks", None)
    chunks = (
        stream(chunk_bytes)
        if callable(stream) and expected is not None and expected > chunk_bytes
        else None
    )
    if chunks is not None:
        written = 0
        for chunk in chunks:
            buffer = _bytes_of(chunk)
            _write_and_hash(f, digest, buffer)
            written += buffer.nbytes
        if written != expected:
            raise PackageError(
                f"tensor {tensor.name!r} streamed {written} bytes, its shape and dtype say "
                f"{expected}",
                where=f"initializer {tensor.name!r}",
                fix="this is a bug in the tensor's iter_chunks; please report it",
            )
        return written
    if tensor.dtype in _NUMPY_BYTES:
        array = tensor.numpy()
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        buffer = memoryview(array.reshape(-1).view(np.uint8))
    else:
        buffer = memoryview(tensor.tobytes())
    _write_and_hash(f, digest, buffer)
    return buffer.nbytes


_hasher: ThreadPoolExecutor | None = None
_hasher_lock = threading.Lock()
_OVERLAP_BYTES = 1 << 20
"""Buffers at least this large are hashed in a helper thread while they are written."""


def _write_and_hash(f: IO[bytes], digest: Any, buffer: memoryview) -> None:
    """``f.write(buffer)`` and ``digest.update(buffer)``, at the same time for large buffers.

    Both release the GIL (hashlib for updates over 2 KiB), so hashing in a helper
    thread while this one writes takes the sha256 of the package data off the build's
    critical path. Both finish before returning: the caller may reuse ``buffer``.
    """
    global _hasher
    if buffer.nbytes < _OVERLAP_BYTES:
        f.write(buffer)
        digest.update(buffer)
        return
    with _hasher_lock:
        if _hasher is None:
            _hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mobius-sha256")
        pool = _hasher
    hashed = pool.submit(digest.update, buffer)
    try:
        f.write(buffer)
    finally:
        hashed.result()


def _bytes_of(chunk: Any) -> memoryview:
    """A flat byte view of one streamed chunk (numpy array, any dtype, or bytes-like)."""
    if isinstance(chunk, np.ndarray):
        return memoryview(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))
    return memoryview(chunk).cast("B")


def _write_runtime_file(tmp: Path, rf: RuntimeFile) -> dict[str, Any]:
    dest = tmp.joinpath(*PurePosixPath(rf.path.replace("\\", "/")).parts)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if rf.content is not None:
        dest.write_bytes(rf.content)
    else:
        assert rf.source is not None  # RuntimeFile guarantees exactly one
        try:
            shutil.copyfile(rf.source, dest)
        except OSError as exc:
            if exc.errno in _NO_ROOM:
                raise  # about OUT's disk, not the source: the caller names the file
            raise PackageError(
                f"cannot copy runtime file: {exc.strerror or exc}",
                where=str(rf.source),
                fix="check that the checkpoint file exists and is readable",
            ) from exc
    sha, size = _sha256_size(dest)
    return {"sha256": sha, "size": size}


_move_into_place = outdir.move_into_place


def _jsonable(value: Any) -> Any:
    """Plain JSON form of manifest values (dataclasses, contracts, paths, tuples)."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return _jsonable(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
