"""Checking a package's files against the sha256 sums in its manifest.

Hashing a multi-gigabyte graph takes seconds, so the sum of a file is cached in
memory keyed by (path, size, mtime): loading the same package twice in one
process hashes once, while any rewrite of the file (new size or mtime) is hashed
again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from mobius.errors import PackageError

_CHUNK = 1 << 20
_CACHE: dict[tuple[str, int, int], str] = {}


def sha256_of(path: Path) -> str:
    """The sha256 hex digest of ``path``, cached by (path, size, mtime_ns)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    _CACHE[key] = digest.hexdigest()
    return _CACHE[key]


def manifest_files(manifest: dict) -> Iterable[tuple[str, str, str | None, int | None]]:
    """(label, relative path, expected sha256, expected size) of every pinned file.

    Components are ``{name: {path, sha256, model_size, data, data_sha256,
    data_size}}`` (see :func:`mobius.package.write_package`); runtime files are
    ``files: {relative path: {sha256, size}}``.
    """
    for name, entry in (manifest.get("components") or {}).items():
        yield f"component {name}", entry["path"], entry.get("sha256"), entry.get("model_size")
        if isinstance(entry.get("data"), str):
            yield (
                f"component {name} weights",
                entry["data"],
                entry.get("data_sha256"),
                entry.get("data_size"),
            )
    for rel, entry in (manifest.get("files") or {}).items():
        entry = entry if isinstance(entry, dict) else {}
        yield "runtime file", rel, entry.get("sha256"), entry.get("size")


def verify_files(root: Path, manifest: dict) -> None:
    """Raise :class:`PackageError` naming the first missing or altered file."""
    for label, rel, expected, size in manifest_files(manifest):
        path = root.joinpath(*PurePosixPath(rel).parts)
        if not path.is_file():
            raise PackageError(
                f"{label}: file {rel} is missing from the package",
                where=str(path),
                fix="rebuild the package with `mobius build`, or copy it again completely",
            )
        if expected is None:
            continue
        actual = sha256_of(path)
        if actual != expected or (size is not None and path.stat().st_size != size):
            raise PackageError(
                f"{label}: file {rel} does not match the sha256 in mobius.json "
                f"(expected {expected[:16]}…, found {actual[:16]}…); the package is corrupted "
                "or was modified",
                where=str(path),
                fix="rebuild the package with `mobius build` (or copy it again)",
            )
