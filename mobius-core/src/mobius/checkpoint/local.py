"""Open a checkpoint folder: ``config.json`` plus safetensors weights.

Weights are found in this order: ``model.safetensors.index.json`` (sharded; the
index is validated against the shards), else ``model.safetensors``, else every
``*.safetensors`` in the folder. Pickle weights (``*.bin``, ``*.pt`` …) are never
loaded: unpickling runs arbitrary code, so mobius reads only safetensors.

A checkpoint is untrusted input: every file mobius reads from it must stay inside
its folder (shard names in the index are plain file names; symlinks may point to
another file of the folder — or, for a Hub snapshot, to the repository's blob
store — but never elsewhere), and one tensor may be claimed by one shard only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from mobius.checkpoint.base import Checkpoint, SourceInfo
from mobius.checkpoint.safetensors import TensorInfo, read_safetensors_header
from mobius.errors import CheckpointError, ConfigError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")

SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "chat_template.jinja",
    "processor_config.json",
    "preprocessor_config.json",
)
"""Files besides weights a package may need; hashed into :class:`SourceInfo` when present."""

CONVERT_FIX = (
    "convert the weights to safetensors, e.g. "
    "`python -c \"from transformers import AutoModel; p='FOLDER'; "
    'AutoModel.from_pretrained(p).save_pretrained(p, safe_serialization=True)"` '
    "(in an environment you trust) or the safetensors convert tool "
    "(https://huggingface.co/spaces/safetensors/convert)"
)

_CHUNK = 16 * 1024 * 1024
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def open_local(
    path: str | os.PathLike[str],
    *,
    require_weights: bool = False,
    source: str | None = None,
) -> Checkpoint:
    """Open a local checkpoint folder.

    ``require_weights=False`` accepts a folder with ``config.json`` and no weights
    (a checkpoint with zero tensors, for graph-only builds); the build decides by
    calling :meth:`Checkpoint.require_weights`. A folder holding only pickle
    weights is refused either way when weights are required, and otherwise
    remembered so that :meth:`Checkpoint.require_weights` explains it.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise CheckpointError(
            "checkpoint folder does not exist",
            where=str(root),
            fix="check the path, or pass a HuggingFace Hub id such as owner/name",
        )
    if not root.is_dir():
        raise CheckpointError(
            "checkpoint source is a file, not a folder",
            where=str(root),
            fix="pass the folder that holds config.json and the *.safetensors files",
        )
    info = SourceInfo(
        source=source if source is not None else str(path), kind="local", revision=None, commit=None
    )
    return open_folder(root.absolute(), info, require_weights=require_weights)


def open_folder(
    root: Path,
    info: SourceInfo,
    *,
    require_weights: bool,
    trust_blob_names: bool = False,
    confine: Path | None = None,
) -> Checkpoint:
    """Build a :class:`Checkpoint` from a folder and partial provenance (used by every opener).

    ``trust_blob_names``: in a HuggingFace cache snapshot, weight files are
    symlinks to blobs named by their sha256; reuse that name instead of hashing
    gigabytes again. ``confine``: the folder every file read must resolve into
    (default ``root``; a Hub snapshot passes its repository cache folder, whose
    ``blobs/`` its symlinks point to).
    """
    jail = _real(confine if confine is not None else root, root)
    raw_config = _read_config(root, jail)
    weight_files, index_file, tensors = _find_tensors(root, jail)

    reason = fix = None
    if not tensors:
        pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            reason = (
                f"the checkpoint has only pickle weights ({', '.join(pickles[:4])}"
                f"{', …' if len(pickles) > 4 else ''}); mobius reads only safetensors "
                "because unpickling can run arbitrary code"
            )
            fix = CONVERT_FIX.replace("FOLDER", str(root))
        elif not weight_files:
            reason = "the checkpoint folder has config.json but no *.safetensors weights"
    hashed = [root / "config.json", *weight_files]
    if index_file is not None:
        hashed.append(index_file)
    for name in SIDE_FILES:
        side = root / name
        if side.is_file():
            confined(side, jail)
            hashed.append(side)
    files = BackgroundHashes(
        {p.relative_to(root).as_posix(): p for p in hashed}, trust_blob_names=trust_blob_names
    )
    source = SourceInfo(
        source=info.source,
        kind=info.kind,
        revision=info.revision,
        commit=info.commit,
        files=files,
    )
    checkpoint = Checkpoint(
        root,
        source,
        raw_config,
        tensors,
        no_weights_reason=reason,
        no_weights_fix=fix,
        confine=jail,
    )
    if require_weights:
        checkpoint.require_weights()
    return checkpoint


def file_sha256(
    path: Path, *, trust_blob_names: bool = False, cancel: threading.Event | None = None
) -> str:
    """sha256 hex of a file, read in 16 MiB chunks into one reused buffer.

    Both the read and ``hashlib``'s update release the GIL, so this runs well in a
    background thread (see :class:`BackgroundHashes`); ``cancel`` set stops it
    between chunks (:class:`_Cancelled`).
    """
    if trust_blob_names and path.is_symlink():
        target = Path(os.readlink(path)).name
        if _SHA256_HEX.fullmatch(target):
            return target
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as f:
        buffer = bytearray(max(1, min(_CHUNK, os.fstat(f.fileno()).st_size)))
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            if cancel is not None and cancel.is_set():
                raise _Cancelled(path)
            digest.update(view[:n])
    return digest.hexdigest()


class _Cancelled(Exception):
    """Hashing stopped because nobody will read the result any more."""


class BackgroundHashes(Mapping[str, str]):
    """Relative file name -> sha256 hex, computed in a background thread.

    Why: a checkpoint's weight files are gigabytes; hashing them before the build
    starts adds a full extra read of the checkpoint to the wall time. The thread
    starts at once (while the graphs are built and the package is written); reading
    the mapping (``files[name]``, iteration, ``len``) waits for it to finish and
    re-raises whatever it raised. Keys are sorted, as the manifest records them.
    When the mapping is dropped unread (a build that failed early), the thread stops
    at its next chunk instead of reading gigabytes for nobody.
    """

    def __init__(self, paths: Mapping[str, Path], *, trust_blob_names: bool = False) -> None:
        self._paths = dict(sorted(paths.items()))
        self._hashes: dict[str, str] = {}
        self._errors: list[BaseException] = []
        cancel = threading.Event()
        # The thread holds the paths, results and event, never ``self``: dropping the
        # mapping finalizes it, which sets the event.
        self._thread = threading.Thread(
            target=_hash_files,
            args=(self._paths, trust_blob_names, self._hashes, self._errors, cancel),
            name="mobius-source-sha256",
            daemon=True,
        )
        weakref.finalize(self, cancel.set)
        self._thread.start()

    def _done(self) -> dict[str, str]:
        self._thread.join()
        if self._errors:
            raise self._errors[0]
        return self._hashes

    def __getitem__(self, name: str) -> str:
        return self._done()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._done())

    def __len__(self) -> int:
        return len(self._done())

    def __repr__(self) -> str:
        state = "hashed" if not self._thread.is_alive() else "hashing"
        return f"BackgroundHashes({len(self._paths)} files, {state})"


def _hash_files(
    paths: Mapping[str, Path],
    trust_blob_names: bool,
    hashes: dict[str, str],
    errors: list[BaseException],
    cancel: threading.Event,
) -> None:
    """Body of the :class:`BackgroundHashes` thread: fill ``hashes`` or record the error."""
    try:
        for name, path in paths.items():
            if cancel.is_set():
                return
            hashes[name] = file_sha256(path, trust_blob_names=trust_blob_names, cancel=cancel)
    except _Cancelled:
        return
    except BaseException as exc:  # re-raised in the reader's thread
        errors.append(exc)


def _real(path: Path, where: Path) -> Path:
    """``path`` with every symlink resolved; CheckpointError for loops and unreadable links."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop (Python < 3.13)
        raise CheckpointError(
            f"cannot resolve {path.name!r}: {exc}",
            where=str(where),
            fix="remove the broken or looping symlink from the checkpoint folder",
        ) from exc


def confined(path: Path, jail: Path) -> Path:
    """The real path of ``path``, which must lie inside ``jail`` (already resolved).

    A symlink to another file of the checkpoint is fine; one that leaves it (to
    ``~/.ssh/…``, ``/etc/…`` or another model) is refused, so a downloaded folder
    cannot make mobius read, hash or package files it does not contain.
    """
    real = _real(path, path)
    if real != jail and jail not in real.parents:
        raise CheckpointError(
            f"{path.name} is a symlink that leaves the checkpoint folder (it points to {real})",
            where=str(path),
            fix="copy the file into the checkpoint folder instead of linking to it, "
            "or remove the link",
        )
    return real


class _DuplicateKey(ValueError):
    def __init__(self, key: str, first: Any, second: Any) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON object hook: a key given twice with two different values is refused."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out and out[key] != value:
            raise _DuplicateKey(key, out[key], value)
        out[key] = value
    return out


def _load_json(path: Path, *, error: type[CheckpointError] | type[ConfigError], fix: str) -> Any:
    """Parse a JSON file; every way the text can be broken or hostile becomes ``error``.

    Besides ``JSONDecodeError``, ``json`` raises ``RecursionError`` (deep nesting) and
    ``ValueError`` (integer literals over Python's 4300-digit limit).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(
            f"{path.name} cannot be read as UTF-8 text ({exc})", where=str(path), fix=fix
        ) from exc
    try:
        return json.loads(text, object_pairs_hook=_strict_object)
    except _DuplicateKey as exc:
        raise error(
            f"{path.name} gives key {exc.key!r} twice, as {_brief(exc.first)} and "
            f"{_brief(exc.second)}",
            where=str(path),
            fix=fix,
        ) from None
    except RecursionError:
        raise error(f"{path.name} is nested too deeply", where=str(path), fix=fix) from None
    except ValueError as exc:
        raise error(f"{path.name} is not valid JSON ({exc})", where=str(path), fix=fix) from exc


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "…"


def _read_config(root: Path, jail: Path) -> dict[str, Any]:
    config = root / "config.json"
    if not config.is_file():
        raise ConfigError(
            "checkpoint folder has no config.json",
            where=str(root),
            fix="pass the folder that holds config.json (the model's HuggingFace folder)",
        )
    confined(config, jail)
    raw = _load_json(
        config, error=ConfigError, fix="re-download config.json or fix the JSON syntax"
    )
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config.json holds a JSON {type(raw).__name__}, expected an object",
            where=str(config),
            fix="re-download config.json",
        )
    return raw


def _find_tensors(root: Path, jail: Path) -> tuple[list[Path], Path | None, dict[str, TensorInfo]]:
    """(weight files, index file or None, tensors by name)."""
    index = root / INDEX_NAME
    if index.is_file():
        confined(index, jail)
        shards, weight_map = _read_index(root, index, jail)
        files = _unique(shards.values())
        tensors = _collect(files)
        for name, shard in weight_map.items():
            info = tensors.get(name)
            if info is None or info.file != shards[shard]:
                raise CheckpointError(
                    f"the index lists tensor {name!r} in {shard} but that shard does not hold it",
                    where=str(index),
                    fix="re-download the checkpoint; the index and the shards do not match",
                )
        return files, index, tensors
    single = root / SINGLE_NAME
    if single.is_file():
        files = [single]
    else:
        files = sorted(p for p in root.glob("*.safetensors") if p.is_file())
    by_real: dict[Path, Path] = {}
    for path in files:  # two names (a symlink and its target) for one file: read it once
        by_real.setdefault(confined(path, jail), path)
    files = list(by_real.values())
    return files, None, _collect(files)


def _unique(paths: Any) -> list[Path]:
    return list(dict.fromkeys(paths))


def _read_index(root: Path, index: Path, jail: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """(shard name -> the path read for it, weight map); one path per distinct real file."""
    fix = "re-download model.safetensors.index.json (it must map tensor names to shard files)"
    data = _load_json(index, error=CheckpointError, fix=fix)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(
            "safetensors index has no weight_map object of tensor name -> shard file",
            where=str(index),
            fix=fix,
        )
    shards: dict[str, Path] = {}
    by_real: dict[Path, Path] = {}
    for shard in dict.fromkeys(weight_map.values()):
        rel = PurePosixPath(shard)
        if (
            rel.is_absolute()
            or "\\" in shard
            or ":" in shard
            or "\x00" in shard
            or len(rel.parts) != 1
            or rel.name in ("", ".", "..")
        ):
            raise CheckpointError(
                f"safetensors index names shard {_brief(shard)}, which is not a plain file name "
                "inside the checkpoint folder",
                where=str(index),
                fix="mobius only reads shards beside the index; " + fix,
            )
        path = (root / rel.name).absolute()
        if not path.is_file():
            raise CheckpointError(
                f"safetensors index lists shard {_brief(shard)}, which is missing",
                where=str(index),
                fix="download the missing shard (or the whole checkpoint again)",
            )
        # Two spellings or a symlink may name one file: it is read once, under its first name.
        shards[shard] = by_real.setdefault(confined(path, jail), path)
    return shards, weight_map


def _collect(files: list[Path]) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for path in _unique(files):
        for info in read_safetensors_header(path):
            other = tensors.get(info.name)
            if other is not None:
                raise CheckpointError(
                    f"tensor {info.name!r} is stored twice (claimed by two shards), in "
                    f"{other.file.name} and {path.name}",
                    where=str(path.parent),
                    fix="remove the stray safetensors file, or add model.safetensors.index.json",
                )
            tensors[info.name] = info
    return tensors
