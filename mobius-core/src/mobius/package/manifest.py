"""The manifest (``mobius.json``): format constants, reading and validating it, hashing files.

See :mod:`mobius.package` for the layout.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from mobius import outdir
from mobius.errors import PackageError

MANIFEST_NAME = outdir.MANIFEST_NAME
"""The manifest file name (defined in :mod:`mobius.outdir`, which decides what a package is)."""
FORMAT_VERSION = 1
MODEL_NAME = "model.onnx"
DATA_NAME = "model.onnx.data"
ALIGNMENT = 64
"""Byte alignment of every tensor in external data (friendly to memory-mapped loads)."""

INLINE_LIMIT = 1024
"""Tensors smaller than this many bytes are stored inside ``model.onnx`` (see ``_inline``)."""

_CHUNK = 8 * 1024 * 1024


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


def _read_manifest(root: Path) -> dict[str, Any]:
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
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageError(
            f"{MANIFEST_NAME} is not valid JSON ({exc})",
            where=str(path),
            fix="rebuild the package with mobius build",
        ) from exc
    if not isinstance(manifest, dict):
        raise PackageError(
            f"{MANIFEST_NAME} is not a JSON object", where=str(path), fix="rebuild the package"
        )
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise PackageError(
            f"unknown package format_version {version!r} (this mobius reads {FORMAT_VERSION})",
            where=str(path),
            fix="rebuild the package with this mobius, or install the mobius that wrote it",
        )
    components = manifest.get("components")
    if not isinstance(components, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("path"), str) for v in components.values()
    ):
        raise PackageError(
            f"{MANIFEST_NAME} has no valid components table",
            where=str(path),
            fix="rebuild the package with mobius build",
        )
    return manifest


def _inside(root: Path, rel: str) -> Path:
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
        raise PackageError(
            f"manifest path {rel!r} leaves the package folder",
            where=str(root / MANIFEST_NAME),
            fix="rebuild the package; do not trust this one",
        )
    return root.joinpath(*parts)
