"""Install repo distributions non-editably, plus only the local distributions they declare.

Why: mobius-core and the plugins are not on PyPI, so pip cannot resolve a
requirement such as ``mobius-core>=0.1`` by itself. This script reads each named
distribution's ``pyproject.toml``, follows its declared requirements (and those
of the extras asked for) to other distributions in this repository, and installs
exactly those local folders in one ``pip install`` call. Nothing undeclared is
added, so a missing dependency declaration makes the tox env fail.

The compatibility matrix (tox label ``compat``) also installs *released* versions:
``--pin NAME=WHICH`` takes distribution NAME from the git commit ``releases.toml``
records for it instead of from the working tree. WHICH is a version (``0.1.0``),
``last`` (its newest release), ``floor`` (the oldest release that every other
distribution being installed allows: "the oldest core this plugin supports") or
``head`` (the working tree, i.e. no pin). The commit's whole tree is extracted to
``<env>/mobius-pinned/NAME/`` (its tests included, so an env can run a release's
own tests) with a ``.mobius-release.json`` stamp that .ci/check_versions.py checks.
``--lowest DIST`` installs DIST at the lowest version the installed distributions
declare (``onnxruntime-gpu>=1.30`` -> ``onnxruntime-gpu==1.30``).

**Wheelhouse.** With ``MOBIUS_WHEELHOUSE`` set to a folder (tox sets
``{toxworkdir}/wheelhouse``), the main install first tries the folder alone
(``pip install --no-index --find-links``); only when that fails does ``pip download``
resolve against the index as usual and save into the folder the files it lacks, then
the same offline install runs again (``MOBIUS_WHEELHOUSE_REFRESH=1`` always asks the
index first). Why:
pip's HTTP cache stays empty where the index answers without caching headers (this
machine's PyPI mirror sends no Cache-Control, ETag or Last-Modified, so pip's
CacheControl stores nothing and every env downloaded the ~280 MB onnxruntime-gpu
wheel again); the folder is shared by every tox env, so each wheel is fetched once
per tox work dir. Downloads land in a private temporary folder and are renamed into
the wheelhouse, so envs running in parallel never see a half-written wheel. The
``--no-deps`` install (local folders only) always goes straight to pip.

Usage: ``python .ci/install_local.py mobius-gemma4[test] [more ...] [--no-deps NAME ...]
[--pin NAME=WHICH ...] [--lowest DIST ...]``
or ``python .ci/install_local.py --forbid DIST ...`` (fail when any DIST is installed).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ModuleNotFoundError:  # a fresh env has pip's vendored copy only
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]
    from pip._vendor.packaging.version import Version  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
RELEASES = ROOT / "releases.toml"
PINNED_DIR = "mobius-pinned"
STAMP = ".mobius-release.json"
# what an extracted release leaves out: its CI scripts and workflows (this checkout's
# .ci runs the matrix; a release's own copy is never run)
NOT_EXTRACTED = frozenset({".ci", ".github"})
# bumped when what an extraction holds changes, so older extractions are redone
EXTRACT_LAYOUT = 2
# an absolute path to a fixtures folder outside the repository, as old tests wrote it
OUTSIDE_FIXTURES = re.compile(r"""(^|["'\s])/[^"'\s]*?/shared/fixtures/configs""", re.MULTILINE)
REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pyproject(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))


def local_distributions(root: Path = ROOT) -> dict[str, Path]:
    """Canonical distribution name -> folder, for every ``*/pyproject.toml`` under ``root``."""
    out = {}
    for pyproject in sorted(root.glob("*/pyproject.toml")):
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        name = data.get("project", {}).get("name")
        if name:
            out[canonical(name)] = pyproject.parent
    return out


def releases() -> dict[str, list[dict]]:
    """Canonical distribution name -> its releases from releases.toml, oldest first."""
    data = tomllib.loads(RELEASES.read_text(encoding="utf-8"))
    out: dict[str, list[dict]] = {}
    for entry in data.get("release", []):
        out.setdefault(canonical(entry["distribution"]), []).append(entry)
    for entries in out.values():
        entries.sort(key=lambda e: Version(e["version"]))
    return out


def parse(spec: str) -> tuple[str, set[str]]:
    m = REQ.match(spec)
    if m is None:
        raise SystemExit(f"install_local: cannot parse requirement {spec!r}")
    extras = {e.strip() for e in (m.group(2) or "").split(",") if e.strip()}
    return canonical(m.group(1)), extras


def requirements_of(folder: Path, extras: set[str]) -> list[str]:
    """The requirement lines ``folder``'s pyproject declares, plus those of ``extras``."""
    project = read_pyproject(folder)["project"]
    reqs = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in sorted(extras):
        if extra not in optional:
            raise SystemExit(f"install_local: {folder.name} has no extra [{extra}]")
        reqs += optional[extra]
    return reqs


def closure(roots: list[str], local: dict[str, Path]) -> dict[str, set[str]]:
    """Local distribution -> extras to install, following declared requirements."""
    wanted: dict[str, set[str]] = {}
    todo = [parse(r) for r in roots]
    while todo:
        name, extras = todo.pop()
        if name not in local:
            raise SystemExit(f"install_local: {name} is not a distribution of this repository")
        if name in wanted and extras <= wanted[name]:
            continue
        wanted[name] = wanted.get(name, set()) | extras
        for req in requirements_of(local[name], wanted[name]):
            dep, dep_extras = parse(req)
            if dep in local:
                todo.append((dep, dep_extras))
    return wanted


def declared_specifier(
    target: str, wanted: dict[str, set[str]], folders: dict[str, Path]
) -> tuple[SpecifierSet, list[str]]:
    """Intersection of what the distributions in ``wanted`` require of ``target``.

    Returns the specifier and, for messages, who declared which part. Requirements
    behind environment markers that do not hold here are left out.
    """
    spec = SpecifierSet()
    who = []
    for name, extras in sorted(wanted.items()):
        if name == target:
            continue
        for line in requirements_of(folders[name], extras):
            req = Requirement(line)
            if canonical(req.name) != target:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            spec &= req.specifier
            who.append(f"{name}: {req.name}{req.specifier}")
    return spec, who


def resolve_pin(
    name: str, which: str, wanted: dict[str, set[str]], folders: dict[str, Path]
) -> dict | None:
    """The releases.toml entry ``which`` names for ``name`` (``None`` for ``head``)."""
    if which == "head":
        return None
    known = releases().get(name, [])
    if not known:
        raise SystemExit(f"install_local: releases.toml records no release of {name}")
    if which == "last":
        return known[-1]
    if which == "floor":
        spec, who = declared_specifier(name, wanted, folders)
        allowed = [e for e in known if spec.contains(Version(e["version"]), prereleases=True)]
        if not allowed:
            raise SystemExit(
                f"install_local: no release of {name} in releases.toml satisfies "
                f"{spec or '(any)'} (declared by {'; '.join(who) or 'nobody'}); "
                f"released: {', '.join(e['version'] for e in known)}"
            )
        print(f"install_local: floor of {name} for {'; '.join(who) or '(no requirement)'}")
        return allowed[0]
    for entry in known:
        if Version(entry["version"]) == Version(which):
            return entry
    raise SystemExit(
        f"install_local: releases.toml has no {name} {which}; "
        f"released: {', '.join(e['version'] for e in known)}"
    )


def extract_release(name: str, entry: dict, dest_root: Path) -> Path:
    """Extract the tree of ``entry['commit']`` to ``dest_root/name``; its folder for ``name``.

    Why ``git archive`` and not a worktree: it leaves the repository's state
    untouched (no worktree registration), and the tree is exactly the commit.
    """
    commit = entry["commit"]
    dest = dest_root / name
    stamp = dest / STAMP
    fresh = False
    if stamp.is_file():
        record = json.loads(stamp.read_text(encoding="utf-8"))
        fresh = record["commit"] == commit and record.get("layout") == EXTRACT_LAYOUT
    if not fresh:  # else: extracted by an earlier run of this env
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        try:
            blob = subprocess.run(
                ["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                check=True,
                capture_output=True,
            ).stdout
        except subprocess.CalledProcessError as exc:
            raise SystemExit(
                f"install_local: cannot read commit {commit} of {name} {entry['version']} "
                f"(a shallow clone? fetch full history: git fetch --unshallow): "
                f"{exc.stderr.decode(errors='replace').strip()}"
            ) from exc
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            # our own repository's tree; the "data" filter where this Python has it
            extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            members = [m for m in tar.getmembers() if m.name.split("/", 1)[0] not in NOT_EXTRACTED]
            tar.extractall(dest, members=members, **extra)
        rewritten = point_fixtures_inside(dest)
        record = {
            "distribution": name,
            "version": entry["version"],
            "commit": commit,
            "layout": EXTRACT_LAYOUT,
            "fixture_paths_rewritten": rewritten,
        }
        stamp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    link_shared(dest_root)
    folder = local_distributions(dest).get(name)
    if folder is None:
        raise SystemExit(f"install_local: commit {commit} has no distribution {name}")
    version = read_pyproject(folder)["project"]["version"]
    if Version(version) != Version(entry["version"]):
        raise SystemExit(
            f"install_local: releases.toml says {name} {entry['version']} is commit {commit}, "
            f"but that commit's {folder.name}/pyproject.toml says version {version}"
        )
    return folder


def point_fixtures_inside(dest: Path) -> list[str]:
    """Make an extracted release's tests read the model configs from this repository.

    Why: the tests of releases up to 0.1.0 named a fixtures folder outside the
    repository, some by an absolute path (``/<somewhere>/shared/fixtures/configs/...``,
    in code and in comments).
    This repository carries the same files in ``testdata/configs`` (PROVENANCE.md says
    where each comes from), so each such absolute path in an extracted ``.py`` file is
    rewritten to that folder; the rewritten files are listed in the stamp. Only test
    files of old releases have such paths: the installed package files are untouched
    (.ci/check_versions.py compares them with the commit).
    """
    inside = (ROOT / "testdata" / "configs").as_posix()
    rewritten = []
    for path in sorted(dest.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        new = OUTSIDE_FIXTURES.sub(lambda m: m.group(1) + inside, text)
        if new != text:
            path.write_text(new, encoding="utf-8", errors="surrogateescape")
            rewritten.append(path.relative_to(dest).as_posix())
    return rewritten


def link_shared(dest_root: Path) -> None:
    """Give an extracted tree the ``shared/fixtures/configs`` folder its tests look for.

    Why: the tests of releases up to 0.1.0 also find the full-size model configs
    relative to their checkout, one level above it; a release extracted to
    ``dest_root/NAME`` looks for ``dest_root/shared/fixtures/configs``, so that
    becomes a link to this working tree's own copy, ``testdata/configs`` (the same
    files; see its PROVENANCE.md). Nothing outside the repository is used.
    """
    inside = ROOT / "testdata" / "configs"
    link = dest_root / "shared" / "fixtures" / "configs"
    if inside.is_dir() and not link.exists() and not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(inside, target_is_directory=True)


def lowest_pin(dist: str, wanted: dict[str, set[str]], folders: dict[str, Path]) -> str:
    """``DIST==V`` with V the highest lower bound the distributions being installed declare.

    DIST may carry extras (``ray[serve]``): the bound is looked up by the bare name (a
    declared ``ray[serve]>=2.56`` bounds ``ray``) and the pin keeps the extras.
    """
    name, extras = parse(dist)
    spec, who = declared_specifier(name, wanted, folders)
    bounds = [Version(s.version) for s in spec if s.operator in (">=", "==", "~=", "===")]
    if not bounds:
        raise SystemExit(f"install_local: nothing installed here declares a lower bound on {name}")
    low = max(bounds)
    print(f"install_local: lowest {name} declared: {low} ({'; '.join(who)})")
    return f"{name}{'[' + ','.join(sorted(extras)) + ']' if extras else ''}=={low}"


def build_requirements(folders: list[Path]) -> list[str]:
    """The ``[build-system] requires`` of ``folders``: an offline install builds them too."""
    reqs: list[str] = []
    for folder in folders:
        for req in read_pyproject(folder).get("build-system", {}).get("requires", []):
            if req not in reqs:
                reqs.append(req)
    return reqs


def fill_wheelhouse(wheelhouse: Path, requirements: list[str]) -> None:
    """Resolve ``requirements`` against the index; add the files ``wheelhouse`` lacks.

    pip sees the wheelhouse as an extra link source, so what is already there is
    copied locally rather than downloaded. New files are renamed in (atomic on one
    file system) and never overwrite one already there, so an env installing from the
    wheelhouse in parallel sees each file either complete or not at all.
    """
    wheelhouse.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheelhouse) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", tmp]
        subprocess.run([*cmd, "--find-links", str(wheelhouse), *requirements], check=True)
        added = []
        for path in sorted(Path(tmp).iterdir()):
            target = wheelhouse / path.name
            if path.is_file() and not target.exists():
                os.replace(path, target)
                added.append(f"{path.name} ({target.stat().st_size // 2**20} MiB)")
    count = sum(1 for p in wheelhouse.iterdir() if p.is_file())
    print(
        f"install_local: wheelhouse {wheelhouse}: {len(added)} new file(s), {count} in all, "
        f"{time.monotonic() - start:.0f} s" + (f"; new: {', '.join(added)}" if added else ""),
        flush=True,
    )


def install_offline_first(pip: list[str], targets: list[str]) -> bool:
    """Install ``targets`` from the wheelhouse alone; False when it lacks something.

    Why: asking the index costs ~25 s per env even when every file is already in the
    wheelhouse (23 envs in the ci label). pip resolves before it installs, so a miss
    installs nothing. MOBIUS_WHEELHOUSE_REFRESH=1 skips this and always asks the index
    (a long-lived wheelhouse otherwise keeps the versions it first saw).
    """
    if os.environ.get("MOBIUS_WHEELHOUSE_REFRESH", "").strip() not in ("", "0"):
        return False
    start = time.monotonic()
    done = subprocess.run([*pip, *targets], capture_output=True, text=True)
    if done.returncode == 0:
        print(
            f"install_local: installed from the wheelhouse alone in "
            f"{time.monotonic() - start:.0f} s (no index query)",
            flush=True,
        )
        return True
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    print(f"install_local: the wheelhouse lacks something ({last}); asking the index", flush=True)
    return False


def forbid(names: list[str]) -> int:
    """Fail when any of ``names`` is installed (keeps incompatible stacks apart)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in names:
        with contextlib.suppress(PackageNotFoundError):
            found.append(f"{name}=={version(name)}")
    if found:
        print(f"install_local: must not be installed here: {', '.join(found)}", file=sys.stderr)
        return 1
    print(f"install_local: none installed of {', '.join(names)}", flush=True)
    return 0


def parse_args(argv: list[str]) -> tuple[list[str], list[str], dict[str, str], list[str]]:
    """(roots, --no-deps names, --pin NAME -> WHICH, --lowest DISTs)."""
    roots: list[str] = []
    nodeps: list[str] = []
    pins: dict[str, str] = {}
    lowest: list[str] = []
    bucket = roots
    args = iter(argv)
    for arg in args:
        if arg == "--no-deps":
            bucket = nodeps
        elif arg in ("--pin", "--lowest"):
            value = next(args, None)
            if value is None:
                raise SystemExit(f"install_local: {arg} needs a value")
            if arg == "--lowest":
                lowest.append(value)
                continue
            name, sep, which = value.partition("=")
            if not sep or not which:
                raise SystemExit(f"install_local: --pin wants NAME=WHICH, got {value!r}")
            pins[canonical(name)] = which
        else:
            bucket.append(arg)
    return roots, nodeps, pins, lowest


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--forbid":
        return forbid(argv[1:])
    roots, nodeps_roots, pins, lowest = parse_args(argv)
    local = local_distributions()
    folders = dict(local)
    wanted = closure(roots, folders) if roots else {}
    pinned_root = Path(sys.prefix) / PINNED_DIR
    for name, which in sorted(pins.items()):
        if name not in local:
            raise SystemExit(f"install_local: {name} is not a distribution of this repository")
        entry = resolve_pin(name, which, wanted, folders)
        if entry is None:
            continue
        folders[name] = extract_release(name, entry, pinned_root)
        print(f"install_local: {name} {entry['version']} from commit {entry['commit']}")
        # the pinned tree may declare other requirements than the working tree
        wanted = closure(roots, folders)
    for name in pins:
        if name not in wanted and name not in {parse(s)[0] for s in nodeps_roots}:
            raise SystemExit(f"install_local: --pin {name}: nothing here installs {name}")
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    targets = []
    for name, extras in sorted(wanted.items()):
        suffix = f"[{','.join(sorted(extras))}]" if extras else ""
        targets.append(f"{folders[name]}{suffix}")
    targets += [lowest_pin(dist, wanted, folders) for dist in lowest]
    if targets:
        print("install_local:", " ".join(targets), flush=True)
        wheelhouse = os.environ.get("MOBIUS_WHEELHOUSE", "").strip()
        if wheelhouse:
            pip += ["--no-index", "--find-links", wheelhouse]
            if not install_offline_first(pip, targets):
                build = build_requirements([folders[name] for name in wanted])
                fill_wheelhouse(Path(wheelhouse), [*targets, *build])
                subprocess.run([*pip, *targets], check=True)
        else:
            subprocess.run([*pip, *targets], check=True)
    nodeps_folders = []
    for spec in nodeps_roots:
        name, _ = parse(spec)
        if name not in local:
            raise SystemExit(f"install_local: {name} is not a distribution of this repository")
        nodeps_folders.append(str(folders[name]))
    if nodeps_folders:
        print("install_local (--no-deps):", " ".join(nodeps_folders), flush=True)
        subprocess.run([*pip, "--no-deps", *nodeps_folders], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
