"""Open a checkpoint folder: ``config.json`` plus safetensors weights.

Weights are found in this order: ``model.safetensors.index.json`` (sharded; the
index is validated against the shards), else ``model.safetensors``, else every
``*.safetensors`` in the folder. Pickle weights (``*.bin``, ``*.pt`` …) are never
loaded: unpickling runs arbitrary code, so mobius reads only safetensors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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

_CHUNK = 8 * 1024 * 1024
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
    root: Path, info: SourceInfo, *, require_weights: bool, trust_blob_names: bool = False
) -> Checkpoint:
    """Build a :class:`Checkpoint` from a folder and partial provenance (used by every opener).

    ``trust_blob_names``: in a HuggingFace cache snapshot, weight files are
    symlinks to blobs named by their sha256; reuse that name instead of hashing
    gigabytes again.
    """
    raw_config = _read_config(root)
    weight_files, index_file, tensors = _find_tensors(root)

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
    hashed += [root / name for name in SIDE_FILES if (root / name).is_file()]
    files = {
        p.relative_to(root).as_posix(): file_sha256(p, trust_blob_names=trust_blob_names)
        for p in hashed
    }
    source = SourceInfo(
        source=info.source,
        kind=info.kind,
        revision=info.revision,
        commit=info.commit,
        files=dict(sorted(files.items())),
    )
    checkpoint = Checkpoint(
        root, source, raw_config, tensors, no_weights_reason=reason, no_weights_fix=fix
    )
    if require_weights:
        checkpoint.require_weights()
    return checkpoint


def file_sha256(path: Path, *, trust_blob_names: bool = False) -> str:
    """sha256 hex of a file, streamed in 8 MiB chunks."""
    if trust_blob_names and path.is_symlink():
        target = Path(os.readlink(path)).name
        if _SHA256_HEX.fullmatch(target):
            return target
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _read_config(root: Path) -> dict[str, Any]:
    config = root / "config.json"
    if not config.is_file():
        raise ConfigError(
            "checkpoint folder has no config.json",
            where=str(root),
            fix="pass the folder that holds config.json (the model's HuggingFace folder)",
        )
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"config.json is not valid JSON ({exc})",
            where=str(config),
            fix="re-download config.json or fix the JSON syntax",
        ) from exc
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config.json holds a JSON {type(raw).__name__}, expected an object",
            where=str(config),
            fix="re-download config.json",
        )
    return raw


def _find_tensors(root: Path) -> tuple[list[Path], Path | None, dict[str, TensorInfo]]:
    """(weight files, index file or None, tensors by name)."""
    index = root / INDEX_NAME
    if index.is_file():
        shards, weight_map = _read_index(root, index)
        tensors = _collect(shards)
        for name, shard in weight_map.items():
            info = tensors.get(name)
            if info is None or info.file.name != (root / shard).name:
                raise CheckpointError(
                    f"the index lists tensor {name!r} in {shard} but that shard does not hold it",
                    where=str(index),
                    fix="re-download the checkpoint; the index and the shards do not match",
                )
        return shards, index, tensors
    single = root / SINGLE_NAME
    if single.is_file():
        files = [single]
    else:
        files = sorted(p for p in root.glob("*.safetensors") if p.is_file())
    return files, None, _collect(files)


def _read_index(root: Path, index: Path) -> tuple[list[Path], dict[str, str]]:
    fix = "re-download model.safetensors.index.json (it must map tensor names to shard files)"
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"safetensors index is not valid JSON ({exc})", where=str(index), fix=fix
        ) from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(
            "safetensors index has no weight_map object of tensor name -> shard file",
            where=str(index),
            fix=fix,
        )
    shards: list[Path] = []
    for shard in dict.fromkeys(weight_map.values()):
        rel = PurePosixPath(shard)
        if (
            rel.is_absolute()
            or "\\" in shard
            or ":" in shard
            or len(rel.parts) != 1
            or rel.name in ("", ".", "..")
        ):
            raise CheckpointError(
                f"safetensors index names shard {shard!r}, which is not a plain file name "
                "inside the checkpoint folder",
                where=str(index),
                fix="mobius only reads shards beside the index; " + fix,
            )
        path = root / shard
        if not path.is_file():
            raise CheckpointError(
                f"safetensors index lists shard {shard!r}, which is missing",
                where=str(index),
                fix="download the missing shard (or the whole checkpoint again)",
            )
        shards.append(path)
    return shards, weight_map


def _collect(files: list[Path]) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for path in files:
        for info in read_safetensors_header(path):
            other = tensors.get(info.name)
            if other is not None:
                raise CheckpointError(
                    f"tensor {info.name!r} is stored twice, in {other.file.name} and {path.name}",
                    where=str(path.parent),
                    fix="remove the stray safetensors file, or add model.safetensors.index.json",
                )
            tensors[info.name] = info
    return tensors
