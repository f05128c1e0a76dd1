"""The one check of a package, run by ``mobius verify``, by the build and by ``Pipeline.load``.

A package is untrusted input (people download them), so before anything is
allocated or handed to onnxruntime every fact the runtime relies on is checked,
and every violation is listed:

1. the manifest's schema (:func:`mobius.package.manifest.manifest_problems`) and the
   contract's consistency, including what the runtime allocates from it (state
   initial shapes, absent-modality shapes, presence-gated components:
   :meth:`mobius.contract.Contract.problems`);
2. every file the manifest pins resolves, *after symlinks*, to a regular file inside
   the package, and has the size the manifest says — compared before anything is
   hashed, so a 1 TiB sparse file costs one ``stat``;
3. content (skipped when a valid :mod:`~mobius.package.stamp` vouches for these exact
   files): sha256 of every pinned file; every external-data reference of every
   tensor in every graph (initializers and tensor attributes, subgraphs included)
   names a file the manifest pins, inside the package, and lies within it; the
   graphs match the contract (:func:`mobius.contract.validate`); ``config.json`` and
   ``tokenizer.json`` parse and have the schema their readers need.

:func:`check_package` returns every problem; ``verify_package`` prints them and
``Pipeline.load`` refuses the package when there is any.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from mobius.errors import ContractError, PackageError
from mobius.package import stamp
from mobius.package.content import check_tokenizer_file, load_json
from mobius.package.manifest import MANIFEST_NAME, MAX_COMPONENTS, _inside, _sha256_size
from mobius.package.reader import Package, read_package

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "config.json"
RUNTIME_READS = (
    TOKENIZER_FILE,
    CONFIG_FILE,
    "genai_config.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
"""Files the runtime opens by name in the package root: each must be pinned when present."""


@dataclass(frozen=True)
class Pinned:
    """One file the manifest pins: where it is said to be and what it must be."""

    label: str
    rel: str
    sha256: str | None
    size: int | None


@dataclass
class CheckResult:
    """What :func:`check_package` found. ``package`` is None when the manifest is unreadable."""

    package: Package | None
    problems: list[str]
    hashed: bool
    """True when file contents were hashed and graphs read; False when a stamp vouched."""
    stamped: bool = False
    """True when this check wrote a fresh stamp."""
    error: PackageError | None = None
    """The error that made the manifest unreadable (``package`` is then None)."""


def pinned_files(manifest: dict[str, Any]) -> list[Pinned]:
    """Every file a (schema-checked) manifest pins, components first."""
    out = []
    for name, entry in manifest["components"].items():
        out.append(
            Pinned(f"component {name}", entry["path"], entry.get("sha256"), entry.get("model_size"))
        )
        if isinstance(entry.get("data"), str):
            out.append(
                Pinned(
                    f"component {name} weights",
                    entry["data"],
                    entry.get("data_sha256"),
                    entry.get("data_size"),
                )
            )
        shared = entry.get("shared")
        if isinstance(shared, dict):
            out.append(
                Pinned(
                    f"component {name} shared weights",
                    shared["path"],
                    shared.get("sha256"),
                    shared.get("size"),
                )
            )
    for rel, entry in (manifest.get("files") or {}).items():
        out.append(Pinned("runtime file", rel, entry.get("sha256"), entry.get("size")))
    return out


def check_package(
    path: str | os.PathLike[str], *, trust_stamp: bool, hash_files: bool = True
) -> CheckResult:
    """Check the package at ``path``; see the module docstring.

    ``trust_stamp``: skip the content checks when the stamp matches (``Pipeline.load``);
    ``mobius verify`` passes False. ``hash_files=False`` is for the writer, which
    hashed what it wrote. A stamp is written when every check passed in full.
    """
    try:
        package = read_package(path)
    except PackageError as exc:
        return CheckResult(None, [exc.render()], hashed=False, error=exc)
    root = package.root
    contract_problems = [f"contract: {p}" for p in _contract_problems(package)]
    problems = list(contract_problems)
    real_root = root.resolve()
    found: dict[str, Path] = {}  # rel -> resolved path of files that exist with the right size
    identities: dict[str, list[int]] = {}
    manifest_info = os.stat(root / MANIFEST_NAME)
    identities[MANIFEST_NAME] = stamp.identity(manifest_info)
    pinned = pinned_files(package.manifest)
    for pin in pinned:
        resolved = _locate(root, real_root, pin.rel, problems)
        if resolved is None:
            continue
        info = resolved.stat()
        identities[pin.rel] = stamp.identity(info)
        if pin.sha256 is None or pin.size is None:
            problems.append(f"{pin.rel}: no sha256 and size in the manifest")
        elif info.st_size != pin.size:
            problems.append(f"{pin.rel}: size {info.st_size} bytes, manifest says {pin.size}")
        else:
            found[pin.rel] = resolved
    for name in RUNTIME_READS:
        if name not in identities and os.path.lexists(root / name):
            problems.append(
                f"{name}: in the package folder but not pinned by the manifest (the runtime "
                "reads it, so it must be verified)"
            )
    if trust_stamp and not problems and stamp.matches(root, identities):
        return CheckResult(package, [], hashed=False)

    if hash_files:
        hashed: dict[tuple[int, int], str] = {}  # (device, inode) -> sha256: a hard link once
        for pin in pinned:
            if pin.rel not in found:
                continue  # missing or wrong size: reported above, never hashed
            inode = (identities[pin.rel][4], identities[pin.rel][3])
            try:
                actual = hashed.get(inode) or _sha256_size(found[pin.rel])[0]
            except OSError as exc:
                problems.append(f"{pin.rel}: cannot be read ({exc.strerror or exc})")
                continue
            hashed[inode] = actual
            if actual != pin.sha256:
                problems.append(
                    f"{pin.rel}: sha256 {actual} does not match the manifest ({pin.sha256}); "
                    "the file was altered or damaged"
                )
    # Graphs and runtime files of the right size are read even when another file
    # failed, so that one run lists every problem (a parse is bounded by that size).
    problems += _graph_problems(package, found, contract_ok=not contract_problems)
    problems += _runtime_file_problems(package, found)
    if problems:
        return CheckResult(package, problems, hashed=hash_files)
    stamped = stamp.write(root, identities)
    return CheckResult(package, [], hashed=hash_files, stamped=stamped)


def raise_for(result: CheckResult, path: str | os.PathLike[str]) -> Package:
    """The package of a clean result; otherwise PackageError listing every problem."""
    if result.error is not None:
        raise result.error
    if result.problems or result.package is None:
        if len(result.problems) == 1:
            what = f"the package cannot be used: {result.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in result.problems)
            what = f"the package has {len(result.problems)} problem(s):\n{lines}"
        raise PackageError(
            what,
            where=str(Path(path).absolute()),
            fix="rebuild the package with `mobius build` (or copy it again completely); "
            "`mobius verify` lists the same problems",
        )
    return result.package


def _contract_problems(package: Package) -> list[str]:
    count = len(package.contract.components)
    if count > MAX_COMPONENTS:
        return [f"declares {count} components, more than the {MAX_COMPONENTS} a package may have"]
    problems = package.contract.problems()
    declared = {c.name for c in package.contract.components}
    for name in package.manifest["components"]:
        if name not in declared:
            problems.append(f"component {name!r} of the manifest is not in the contract")
    for name in sorted(declared - set(package.manifest["components"])):
        problems.append(f"component {name!r} of the contract has no entry in the manifest")
    return problems


def _locate(root: Path, real_root: Path, rel: str, problems: list[str]) -> Path | None:
    """The resolved path of ``rel`` when it is a regular file inside the package; else None."""
    try:
        file = _inside(root, rel)
    except PackageError as exc:
        problems.append(exc.what)
        return None
    try:
        resolved = file.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, dangling symlink, symlink loop
        problems.append(f"{rel}: missing")
        return None
    if not resolved.is_relative_to(real_root):
        problems.append(
            f"{rel}: resolves to {resolved}, outside the package (a symlink? a package holds "
            "its own files: copy a Hugging Face cache download with `cp -rL PKG NEW`)"
        )
        return None
    try:
        mode = resolved.stat().st_mode
    except OSError:
        problems.append(f"{rel}: missing")
        return None
    if not stat.S_ISREG(mode):
        problems.append(f"{rel}: not a regular file")
        return None
    return resolved


def _graph_problems(package: Package, found: dict[str, Path], *, contract_ok: bool) -> list[str]:
    import onnx_ir as ir

    problems: list[str] = []
    pinned = {path: path.stat().st_size for path in found.values()}
    graphs: dict[str, Any] = {}
    for name, entry in package.manifest["components"].items():
        model_path = found.get(entry["path"])
        if model_path is None:
            continue  # missing or of the wrong size: reported already
        try:
            model = ir.load(model_path)  # external data stays on disk
        except Exception as exc:  # a malformed protobuf raises many types
            problems.append(f"{entry['path']}: cannot be read as an ONNX model ({exc})")
            continue
        problems += _external_data_problems(entry["path"], model, model_path.parent, pinned)
        graphs[name] = model
    if contract_ok and not problems and len(graphs) == len(package.manifest["components"]):
        from mobius.contract import validate

        try:
            validate(package.contract, graphs)
        except ContractError as exc:
            problems.append(f"contract: {exc.what}")
    return problems


def _tensors(model: Any) -> list[Any]:
    """Every tensor a model stores: initializers and tensor attributes, in every (sub)graph."""
    import onnx_ir as ir

    out = []
    for graph in model.graphs():
        out.extend(v.const_value for v in graph.initializers.values() if v.const_value is not None)
        for node in graph:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR:
                    out.append(attr.value)
                elif attr.type == ir.AttributeType.TENSORS:
                    out.extend(attr.value)
    return out


def _external_data_problems(
    rel: str, model: Any, folder: Path, pinned: dict[Path, int]
) -> list[str]:
    """External-data references that leave the package, name unpinned files, or overrun them."""
    import onnx_ir as ir

    problems: list[str] = []
    for tensor in _tensors(model):
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        where = f"{rel}: tensor {tensor.name!r} external data {str(tensor.location)!r}"
        location = PurePosixPath(str(tensor.location).replace("\\", "/"))
        if not location.parts or location.is_absolute() or ".." in location.parts:
            problems.append(f"{where} leaves the package folder")
            continue
        try:
            target = folder.joinpath(*location.parts).resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            problems.append(f"{where} does not exist")
            continue
        size = pinned.get(target)
        if size is None:
            problems.append(
                f"{where} is not a file the manifest pins (outside the package, or unverified)"
            )
            continue
        offset = tensor.offset or 0
        length = tensor.length if tensor.length is not None else tensor.nbytes
        if offset < 0 or length < 0 or offset + length > size:
            problems.append(
                f"{where} reads bytes {offset}..{offset + length}, past the end of the "
                f"{size}-byte file"
            )
        elif length != tensor.nbytes:
            problems.append(
                f"{where} holds {length} bytes, its shape and dtype need {tensor.nbytes}"
            )
    return problems


def _runtime_file_problems(package: Package, found: dict[str, Path]) -> list[str]:
    problems: list[str] = []
    fix = "rebuild the package with mobius build"
    if TOKENIZER_FILE in found:
        try:
            check_tokenizer_file(found[TOKENIZER_FILE], fix)
        except PackageError as exc:
            problems.append(f"{TOKENIZER_FILE}: {exc.what}")
    if CONFIG_FILE in found:
        try:
            config = load_json(found[CONFIG_FILE], CONFIG_FILE, fix)
        except PackageError as exc:
            problems.append(f"{CONFIG_FILE}: {exc.what}")
        else:
            if not isinstance(config, dict):
                problems.append(f"{CONFIG_FILE}: is not a JSON object")
    return problems
