"""The manifest (``mobius.json``): format constants, reading and validating it, hashing files.

See :mod:`mobius.package` for the layout.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from mobius import outdir
from mobius.errors import PackageError
from mobius.package.content import MAX_MANIFEST_BYTES, load_json

MANIFEST_NAME = outdir.MANIFEST_NAME
"""The manifest file name (defined in :mod:`mobius.outdir`, which decides what a package is)."""
FORMAT_VERSION = 1
MODEL_NAME = "model.onnx"
DATA_NAME = "model.onnx.data"
SHARED_NAME = "shared.data"
"""External data that several components read (a tied embedding / lm_head): written once
in the first such component's folder, a hard link of it in each other's (see
:mod:`mobius.package`)."""
ALIGNMENT = 64
"""Byte alignment of every tensor in external data (friendly to memory-mapped loads)."""

INLINE_LIMIT = 1024
"""Tensors smaller than this many bytes are stored inside ``model.onnx`` (see ``_inline``)."""

_CHUNK = 8 * 1024 * 1024


OUTSIDE_FIX = (
    "a package must hold its own files: if it came through the Hugging Face cache (files "
    "are links into its blobs/ folder), copy it with the links resolved (`cp -rL PKG NEW`) "
    "or download it with snapshot_download(..., local_dir=DIR); otherwise do not trust it"
)
"""The fix for a package path that resolves outside the package (manifest or pinned file)."""


def _sha256_size(path: Path) -> tuple[str, int]:
    """sha256 hex and size of a file, read into one buffer no larger than the file."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb", buffering=0) as f:
        buffer = bytearray(max(1, min(_CHUNK, os.fstat(f.fileno()).st_size)))
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            digest.update(view[:n])
            size += n
    return digest.hexdigest(), size


_REBUILD = "rebuild the package with mobius build"
MAX_COMPONENTS = 256
"""Most components a package may declare (real ones have fewer than ten)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMPONENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _read_manifest(root: Path) -> dict[str, Any]:
    """The parsed, schema-checked manifest of the package at ``root``; PackageError otherwise."""
    if not root.is_dir():
        raise PackageError(
            "package folder does not exist",
            where=str(root),
            fix="pass the folder `mobius build` wrote",
        )
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise PackageError(
            f"package has no {MANIFEST_NAME}",
            where=str(root),
            fix="this is not a mobius package (or an unfinished one): rebuild it with mobius build",
        )
    if not path.resolve().is_relative_to(root.resolve()):
        raise PackageError(
            f"{MANIFEST_NAME} resolves to {path.resolve()}, outside the package (a symlink?)",
            where=str(path),
            fix=OUTSIDE_FIX,
        )
    manifest = load_json(path, MANIFEST_NAME, _REBUILD, max_bytes=MAX_MANIFEST_BYTES)
    if not isinstance(manifest, dict):
        raise PackageError(f"{MANIFEST_NAME} is not a JSON object", where=str(path), fix=_REBUILD)
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:  # not True, not 1.0
        shown = repr(version) if len(repr(version)) < 40 else repr(version)[:40] + "…"
        raise PackageError(
            f"unknown package format_version {shown} (this mobius reads {FORMAT_VERSION})",
            where=str(path),
            fix="rebuild the package with this mobius, or install the mobius that wrote it",
        )
    problems = manifest_problems(manifest)
    if problems:
        raise PackageError(
            f"{MANIFEST_NAME} is malformed: " + "; ".join(problems),
            where=str(path),
            fix="rebuild the package with mobius build; do not trust this one",
        )
    return manifest


def _nonneg_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _pin_problems(where: str, entry: dict, sha_key: str, size_key: str) -> list[str]:
    problems = []
    sha = entry.get(sha_key)
    if sha is not None and not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
        problems.append(f"{where}.{sha_key} is not a 64-digit lowercase hex sha256")
    size = entry.get(size_key)
    if size is not None and not _nonneg_int(size):
        problems.append(f"{where}.{size_key} is not a non-negative integer")
    return problems


def manifest_problems(manifest: dict[str, Any]) -> list[str]:
    """Every way the manifest's tables differ from what the writer writes (types, names).

    Paths are only type-checked here; where they lead is checked by
    :func:`mobius.package.checks.check_package` (``_inside`` refuses ``..`` early).
    """
    problems: list[str] = []
    components = manifest.get("components")
    if not isinstance(components, dict) or not components:
        problems.append("has no valid components table (an object of name -> entry)")
        components = {}
    elif len(components) > MAX_COMPONENTS:
        problems.append(
            f"declares {len(components)} components, more than the {MAX_COMPONENTS} "
            "a package may have"
        )
        components = {}
    for name, entry in components.items():
        where = f"components.{name}"
        if not _COMPONENT_NAME.fullmatch(name) or name in (".", ".."):
            problems.append(f"component name {name!r} is not a plain folder name")
        if not isinstance(entry, dict):
            problems.append(f"{where} is not an object")
            continue
        if not isinstance(entry.get("path"), str):
            problems.append(f"{where}.path is not a string")
        if "data" in entry and not isinstance(entry["data"], str):
            problems.append(f"{where}.data is not a string")
        problems += _pin_problems(where, entry, "sha256", "model_size")
        problems += _pin_problems(where, entry, "data_sha256", "data_size")
        if "size" in entry and not _nonneg_int(entry["size"]):
            problems.append(f"{where}.size is not a non-negative integer")
        if "shared" in entry:
            problems += _shared_problems(where, entry["shared"], components)
    files = manifest.get("files", {})
    if not isinstance(files, dict):
        problems.append("files is not an object of relative path -> {sha256, size}")
        files = {}
    for rel, entry in files.items():
        if not isinstance(entry, dict):
            problems.append(f"files.{rel} is not an object")
            continue
        problems += _pin_problems(f"files.{rel}", entry, "sha256", "size")
    if not isinstance(manifest.get("contract", {}), dict):
        problems.append("contract is not an object")
    if "config" in manifest and not isinstance(manifest["config"], dict):
        problems.append("config (the embedded config.json) is not an object")
    for key in ("model_type", "task", "dtype", "target"):
        if key in manifest and not isinstance(manifest[key], str):
            problems.append(f"{key} is not a string")
    return problems


def _shared_problems(where: str, shared: Any, components: dict[str, Any]) -> list[str]:
    """A component's ``shared`` pin: ``{path, sha256, size}`` and, on every component but
    the one whose folder was written first, ``same_file_as`` naming that one's path (the
    same file: equal sha256 and size)."""
    where = f"{where}.shared"
    if not isinstance(shared, dict):
        return [f"{where} is not an object of path, sha256, size"]
    problems = []
    if not isinstance(shared.get("path"), str):
        problems.append(f"{where}.path is not a string")
    problems += _pin_problems(where, shared, "sha256", "size")
    same = shared.get("same_file_as")
    if same is not None:
        first = [
            e["shared"]
            for e in components.values()
            if isinstance(e, dict)
            and isinstance(e.get("shared"), dict)
            and e["shared"].get("path") == same
            and "same_file_as" not in e["shared"]
        ]
        if not isinstance(same, str) or not first:
            problems.append(f"{where}.same_file_as names no other component's shared file")
        elif (first[0].get("sha256"), first[0].get("size")) != (
            shared.get("sha256"),
            shared.get("size"),
        ):
            problems.append(f"{where}: sha256 and size differ from those of {same}, its own file")
    return problems


def _inside(root: Path, rel: str) -> Path:
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts or "\0" in rel:
        raise PackageError(
            f"manifest path {rel!r} leaves the package folder",
            where=str(root / MANIFEST_NAME),
            fix="rebuild the package; do not trust this one",
        )
    return root.joinpath(*parts)
