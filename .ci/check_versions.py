"""Assert what a tox env actually installed: versions, and where each mobius distribution came from.

Why: an env of the compatibility matrix is only worth its minutes if it tests the
combination its name promises. pip happily keeps an editable copy, reuses a
stale install or resolves a different version than intended; this script reads
what is really there (``importlib.metadata``, each distribution's
``direct_url.json`` and ``RECORD``) and fails when it differs from the
expectation. A local editable copy never passes for a pinned release, nor the
reverse.

Usage: ``python .ci/check_versions.py EXPECT ... [--plugins-ok]`` where EXPECT is

- ``mobius-core=local``: installed non-editably from the working-tree folder
  (``mobius-core/``), with that folder's version and exactly its files;
- ``mobius-core=editable``: an editable install of the working-tree folder;
- ``mobius-core=release:V`` with V a version, ``last`` or ``floor`` (the oldest
  release every other installed distribution allows): installed from the commit
  ``releases.toml`` records for that release (see .ci/install_local.py ``--pin``),
  with exactly that commit's files;
- ``NAME=absent``: not installed;
- ``NAME<specifier>`` such as ``onnxruntime-gpu==1.30`` or ``onnxruntime-gpu>1.30``;
- ``NAME=lowest``: at the lowest version the installed distributions declare (their
  extras included: ``ray=lowest`` reads mobius-runtime's ``[ray]``);
- ``NAME=latest``: at the newest version the package index offers this interpreter
  (asks ``pip index versions``, so it needs the index).

Every installed distribution of this repository must be named. ``--plugins-ok``
also loads every ``mobius`` plugin through core's PluginHost and fails unless all
load with status ``ok`` (an ``incompatible`` one means the declared ranges and
what is installed disagree). Run it with the env's interpreter.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import re
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the sibling script, importable through the line above
from install_local import (
    PINNED_DIR,
    ROOT,
    STAMP,
    Requirement,
    SpecifierSet,
    Version,
    canonical,
    local_distributions,
    read_pyproject,
    releases,
)

KIND = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)=([^=].*)$")


class Mismatch(Exception):
    """What was installed is not what the env promised."""


def installed(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def direct_url(dist: metadata.Distribution) -> tuple[Path | None, bool]:
    """(local folder it was installed from, editable?) from PEP 610 ``direct_url.json``."""
    raw = dist.read_text("direct_url.json")
    if not raw:
        return None, False
    data = json.loads(raw)
    url = urlparse(data.get("url", ""))
    folder = Path(unquote(url.path)).resolve() if url.scheme == "file" else None
    return folder, bool(data.get("dir_info", {}).get("editable", False))


def requirements_on(
    target: str, dists: dict[str, metadata.Distribution], extras: bool = False
) -> SpecifierSet:
    """Intersection of what the installed ``dists`` (other than ``target``) require of it.

    With ``extras``, what their extras require counts too (installed metadata cannot
    tell which extras were asked for: ``ray`` comes from mobius-runtime's ``[ray]``).
    """
    spec = SpecifierSet()
    for name, dist in dists.items():
        if name == target:
            continue
        offered = [""]
        if extras:
            offered += dist.metadata.get_all("Provides-Extra") or []
        for line in dist.requires or []:
            req = Requirement(line)
            if canonical(req.name) != target:
                continue
            if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in offered
            ):
                continue
            spec &= req.specifier
    return spec


def record_hashes(dist: metadata.Distribution) -> dict[str, str]:
    """Installed package file -> its RECORD sha256 (dist-info, scripts and bytecode left out)."""
    out = {}
    for item in dist.files or []:
        path = item.as_posix()
        if path.startswith("..") or ".dist-info/" in path or path.endswith((".pyc", ".pth")):
            continue
        if item.hash is None or item.hash.mode != "sha256":
            continue
        out[path] = item.hash.value
    return out


def digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def source_files_at(commit: str | None, folder_name: str, folder: Path) -> dict[str, bytes]:
    """Package path -> bytes of ``<folder>/src/**``, at ``commit`` or (None) on disk."""
    out = {}
    if commit is None:
        src = folder / "src"
        for path in src.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                out[path.relative_to(src).as_posix()] = path.read_bytes()
        return out
    blob = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, f"{folder_name}/src"],
        check=True,
        capture_output=True,
    ).stdout
    prefix = f"{folder_name}/src/"
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith(prefix):
                handle = tar.extractfile(member)
                assert handle is not None
                out[member.name[len(prefix) :]] = handle.read()
    return out


def compare_files(name: str, dist: metadata.Distribution, files: dict[str, bytes], what: str):
    """Every installed package file must hash like ``files``, and every source .py be there."""
    hashes = record_hashes(dist)
    if not hashes:
        raise Mismatch(f"RECORD of {name} lists no package files (an editable install?)")
    differ = sorted(p for p, h in hashes.items() if p not in files or digest(files[p]) != h)
    missing = sorted(p for p in files if p.endswith(".py") and p not in hashes)
    if differ or missing:
        raise Mismatch(
            f"installed files are not those of {what or 'the source'}: "
            f"differ {differ[:5]}{'…' if len(differ) > 5 else ''}, "
            f"not installed {missing[:5]}{'…' if len(missing) > 5 else ''}"
        )
    return len(hashes)


def import_origins(dist: metadata.Distribution) -> dict[str, Path]:
    """Top-level package of ``dist`` -> the file Python actually imports for it."""
    tops = {p.split("/", 1)[0] for p in record_hashes(dist) if "/" in p}
    out = {}
    for top in sorted(tops):
        spec = importlib.util.find_spec(top)
        if spec is None or spec.origin is None:
            raise Mismatch(f"{dist.metadata['Name']}: package {top} cannot be imported")
        out[top] = Path(spec.origin).resolve()
    return out


def check_release(name, dist, which, folder_name, dists) -> str:
    known = releases().get(name, [])
    if which == "last":
        entry = known[-1] if known else None
    elif which == "floor":
        spec = requirements_on(name, dists)
        allowed = [e for e in known if spec.contains(Version(e["version"]), prereleases=True)]
        entry = allowed[0] if allowed else None
        if entry is None:
            raise Mismatch(f"{name}: no release in releases.toml satisfies {spec}")
    else:
        entry = next((e for e in known if Version(e["version"]) == Version(which)), None)
    if entry is None:
        raise Mismatch(f"{name}: releases.toml records no release {which!r}")
    source, editable = direct_url(dist)
    tree = (Path(sys.prefix) / PINNED_DIR / name).resolve()
    if editable:
        raise Mismatch(
            f"{name}: expected release {entry['version']} (commit {entry['commit'][:12]}) "
            f"but an editable copy of {source} is installed"
        )
    if source is None or source != tree / folder_name:
        raise Mismatch(
            f"{name}: expected release {entry['version']} from {tree / folder_name}, "
            f"but it was installed from {source or 'an index (no direct_url.json)'}"
        )
    stamp = json.loads((tree / STAMP).read_text(encoding="utf-8"))
    if stamp.get("commit") != entry["commit"]:
        raise Mismatch(f"{name}: {tree} holds commit {stamp.get('commit')}, not {entry['commit']}")
    if Version(dist.version) != Version(entry["version"]):
        raise Mismatch(f"{name}: installed {dist.version}, release is {entry['version']}")
    files = source_files_at(entry["commit"], folder_name, source)
    try:
        count = compare_files(name, dist, files, f"commit {entry['commit'][:12]}")
    except Mismatch as exc:
        raise Mismatch(f"{name}: {exc}") from None
    for top, origin in import_origins(dist).items():
        if not origin.is_relative_to(Path(sys.prefix).resolve()) or PINNED_DIR in origin.parts:
            raise Mismatch(f"{name}: `import {top}` loads {origin}, not the installed release")
    return f"release {entry['version']} @ {entry['commit'][:12]} ({count} files match)"


def check_local(name, dist, editable_wanted, folder) -> str:
    source, editable = direct_url(dist)
    kind = "an editable" if editable else "a non-editable"
    want = "an editable" if editable_wanted else "a non-editable"
    if editable != editable_wanted or source != folder.resolve():
        raise Mismatch(
            f"{name}: expected {want} install of {folder}, found {kind} install "
            f"from {source or 'an index (no direct_url.json)'}"
        )
    version = read_pyproject(folder)["project"]["version"]
    if Version(dist.version) != Version(version):
        raise Mismatch(f"{name}: installed {dist.version}, {folder.name}/ says {version}")
    origins = import_origins(dist) if not editable else {}
    if editable:
        for top in (p.name for p in (folder / "src").iterdir() if p.is_dir()):
            spec = importlib.util.find_spec(top)
            origin = Path(spec.origin).resolve() if spec and spec.origin else None
            if origin is None or not origin.is_relative_to(folder.resolve()):
                raise Mismatch(f"{name}: `import {top}` loads {origin}, not {folder}")
        return f"editable {folder}"
    for top, origin in origins.items():
        if not origin.is_relative_to(Path(sys.prefix).resolve()):
            raise Mismatch(f"{name}: `import {top}` loads {origin}, not the installed copy")
    # The working tree may legitimately move on after the install (an editor, another
    # checkout): a difference is reported, not failed; path, kind and version decide.
    try:
        count = compare_files(name, dist, source_files_at(None, folder.name, folder), "")
        return f"local {folder} ({count} files match)"
    except Mismatch as exc:
        return f"local {folder} (NOTE: the working tree changed since the install: {exc})"


def lowest_declared(name: str, dists: dict[str, metadata.Distribution]) -> Version:
    spec = requirements_on(name, dists, extras=True)
    bounds = [Version(s.version) for s in spec if s.operator in (">=", "==", "~=", "===")]
    if not bounds:
        raise Mismatch(f"{name}: no installed distribution declares a lower bound on it")
    return max(bounds)


def latest_available(name: str) -> Version:
    """The newest version of ``name`` the configured index offers this interpreter."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "--disable-pip-version-check", name]
    out = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"^\S+ \(([^)]+)\)$", out.stdout, re.MULTILINE)
    if out.returncode != 0 or m is None:
        raise Mismatch(f"{name}: cannot ask the index for its versions: {out.stderr.strip()}")
    return Version(m.group(1))


def check(expectations: list[str]) -> list[str]:
    local = local_distributions()
    dists = {n: d for n in local if (d := installed(n)) is not None}
    lines, problems = [], []
    named = set()
    for raw in expectations:
        kind = KIND.match(raw)
        try:
            if kind is not None:  # NAME=KIND
                key, which = canonical(kind.group(1)), kind.group(2)
                named.add(key)
                dist = installed(key)
                if which == "absent":
                    if dist is not None:
                        raise Mismatch(f"{key}: must not be installed, found {dist.version}")
                    lines.append(f"{key}: absent")
                    continue
                if dist is None:
                    raise Mismatch(f"{key}: expected {which}, not installed")
                if which == "lowest":
                    low = lowest_declared(key, {**dists, key: dist})
                    if Version(dist.version) != low:
                        raise Mismatch(f"{key}: installed {dist.version}, lowest declared {low}")
                    lines.append(f"{key}: {dist.version} (the lowest declared)")
                elif which == "latest":
                    newest = latest_available(key)
                    if Version(dist.version) != newest:
                        raise Mismatch(f"{key}: installed {dist.version}, the index has {newest}")
                    lines.append(f"{key}: {dist.version} (the newest on the index)")
                elif key not in local:
                    raise Mismatch(f"{key}: {which!r} applies to this repository's distributions")
                elif which in ("local", "editable"):
                    where = check_local(key, dist, which == "editable", local[key])
                    lines.append(f"{key}: {dist.version} {where}")
                elif which.startswith("release:"):
                    where = check_release(key, dist, which[8:], local[key].name, dists)
                    lines.append(f"{key}: {dist.version} {where}")
                else:
                    raise Mismatch(f"{raw}: unknown expectation (see the module docstring)")
            else:  # NAME<specifier>
                req = Requirement(raw)
                key = canonical(req.name)
                named.add(key)
                dist = installed(key)
                if dist is None:
                    raise Mismatch(f"{key}: expected {req.specifier}, not installed")
                if not req.specifier.contains(Version(dist.version), prereleases=True):
                    raise Mismatch(f"{key}: installed {dist.version}, expected {req.specifier}")
                lines.append(f"{key}: {dist.version} (wanted {req.specifier})")
        except Mismatch as exc:
            problems.append(str(exc))
    for name in sorted(set(dists) - named):
        problems.append(
            f"{name} {dists[name].version} is installed but the env names no expectation for it"
        )
    for line in lines:
        print(f"check_versions: {line}")
    return problems


def plugins_ok() -> list[str]:
    from mobius import HOOK_API_VERSION
    from mobius.plugins import PluginHost

    records = PluginHost.load().records()
    print(
        f"check_versions: hook API {HOOK_API_VERSION}; plugins: "
        + ", ".join(f"{r.name} ({r.distribution} {r.version}) {r.status}" for r in records)
    )
    return [f"plugin {r.name}: {r.status}: {r.reason}" for r in records if r.status != "ok"]


def main(argv: list[str]) -> int:
    want_plugins = "--plugins-ok" in argv
    expectations = [a for a in argv if a != "--plugins-ok"]
    print(f"check_versions: Python {sys.version.split()[0]} at {sys.prefix}")
    problems = check(expectations)
    if want_plugins and not problems:
        problems += plugins_ok()
    for problem in problems:
        print(f"check_versions: MISMATCH {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
