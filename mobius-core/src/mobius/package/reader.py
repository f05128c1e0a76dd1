"""Reading a package: its manifest, contract and component graph paths."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mobius.errors import ContractError, PackageError
from mobius.package.manifest import MANIFEST_NAME, _inside, _read_manifest

if TYPE_CHECKING:
    from mobius.contract import Contract


@dataclass(frozen=True)
class Package:
    """A package read from disk."""

    root: Path
    manifest: dict[str, Any]
    contract: Contract
    components: dict[str, Path]
    """Component name -> path of its ``model.onnx``."""


def read_package(path: str | os.PathLike[str]) -> Package:
    """Read a package's manifest and contract; PackageError if it is not a valid package."""
    from mobius.contract import Contract

    root = Path(path).absolute()
    manifest = _read_manifest(root)
    components = {
        name: _inside(root, entry["path"]) for name, entry in manifest["components"].items()
    }
    try:
        contract = Contract.from_dict(manifest.get("contract") or {})
    except (ContractError, KeyError, TypeError, ValueError) as exc:
        reason = exc.what if isinstance(exc, ContractError) else f"{type(exc).__name__}: {exc}"
        raise PackageError(
            f"the contract in {MANIFEST_NAME} cannot be read ({reason})",
            where=str(root / MANIFEST_NAME),
            fix="rebuild the package with mobius build",
        ) from exc
    return Package(root=root, manifest=manifest, contract=contract, components=components)
