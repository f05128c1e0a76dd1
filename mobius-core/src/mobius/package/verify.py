"""Verifying a package: every file against its sha256 and size, the graphs against the contract."""

from __future__ import annotations

import os

import onnx_ir as ir

from mobius.errors import ContractError, PackageError
from mobius.package.manifest import _inside, _sha256_size
from mobius.package.reader import read_package


def verify_package(path: str | os.PathLike[str]) -> list[str]:
    """Every problem found in a package: unreadable manifest, missing or altered files
    (sha256 and size against the manifest), and contract violations against the graphs.
    An empty list means the package is intact.
    """
    try:
        package = read_package(path)
    except PackageError as exc:
        return [exc.render()]
    root = package.root
    problems: list[str] = []
    checks: list[tuple[str, str | None, int | None]] = []
    for entry in package.manifest["components"].values():
        checks.append((entry["path"], entry.get("sha256"), entry.get("model_size")))
        if isinstance(entry.get("data"), str):
            checks.append((entry["data"], entry.get("data_sha256"), entry.get("data_size")))
    for rel, entry in (package.manifest.get("files") or {}).items():
        entry = entry if isinstance(entry, dict) else {}
        checks.append((rel, entry.get("sha256"), entry.get("size")))
    for rel, sha, size in checks:
        try:
            file = _inside(root, rel)
        except PackageError as exc:
            problems.append(exc.what)
            continue
        if not file.is_file():
            problems.append(f"{rel}: missing")
            continue
        actual_sha, actual_size = _sha256_size(file)
        if size is not None and actual_size != size:
            problems.append(f"{rel}: size {actual_size} bytes, manifest says {size}")
        if sha is None:
            problems.append(f"{rel}: no sha256 in the manifest")
        elif actual_sha != sha:
            problems.append(f"{rel}: sha256 {actual_sha} does not match the manifest ({sha})")

    graphs: dict[str, ir.Model] = {}
    for name, model_path in package.components.items():
        if not model_path.is_file():
            continue  # reported above
        try:
            graphs[name] = ir.load(model_path)  # external data stays on disk
        except Exception as exc:
            problems.append(f"{name}: {model_path.name} cannot be loaded ({exc})")
    if len(graphs) == len(package.components):
        from mobius.contract import validate

        try:
            validate(package.contract, graphs)
        except ContractError as exc:
            problems.append(f"contract: {exc.what}")
    return problems
