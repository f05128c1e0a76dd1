"""Install repo distributions non-editably, plus only the local distributions they declare.

Why: mobius-core and the plugins are not on PyPI, so pip cannot resolve a
requirement such as ``mobius-core>=0.1`` by itself. This script reads each named
distribution's ``pyproject.toml``, follows its declared requirements (and those
of the extras asked for) to other distributions in this repository, and installs
exactly those local folders in one ``pip install`` call. Nothing undeclared is
added, so a missing dependency declaration makes the tox env fail.

Usage: ``python .ci/install_local.py mobius-gemma4[test] [more ...] [--no-deps NAME ...]``
or ``python .ci/install_local.py --forbid DIST ...`` (fail when any DIST is installed).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def local_distributions() -> dict[str, Path]:
    """Canonical distribution name -> folder, for every ``*/pyproject.toml`` at the root."""
    out = {}
    for pyproject in sorted(ROOT.glob("*/pyproject.toml")):
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        name = data.get("project", {}).get("name")
        if name:
            out[canonical(name)] = pyproject.parent
    return out


def parse(spec: str) -> tuple[str, set[str]]:
    m = REQ.match(spec)
    if m is None:
        raise SystemExit(f"install_local: cannot parse requirement {spec!r}")
    extras = {e.strip() for e in (m.group(2) or "").split(",") if e.strip()}
    return canonical(m.group(1)), extras


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
        project = tomllib.loads((local[name] / "pyproject.toml").read_text(encoding="utf-8"))
        reqs = list(project["project"].get("dependencies", []))
        optional = project["project"].get("optional-dependencies", {})
        for extra in sorted(extras):
            if extra not in optional:
                raise SystemExit(f"install_local: {name} has no extra [{extra}]")
            reqs += optional[extra]
        for req in reqs:
            dep, dep_extras = parse(req)
            if dep in local:
                todo.append((dep, dep_extras))
    return wanted


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


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--forbid":
        return forbid(argv[1:])
    roots, nodeps_roots = [], []
    bucket = roots
    for arg in argv:
        if arg == "--no-deps":
            bucket = nodeps_roots
        else:
            bucket.append(arg)
    local = local_distributions()
    wanted = closure(roots, local) if roots else {}
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    targets = []
    for name, extras in sorted(wanted.items()):
        suffix = f"[{','.join(sorted(extras))}]" if extras else ""
        targets.append(f"{local[name]}{suffix}")
    if targets:
        print("install_local:", " ".join(targets), flush=True)
        subprocess.run([*pip, *targets], check=True)
    folders = []
    for spec in nodeps_roots:
        name, _ = parse(spec)
        if name not in local:
            raise SystemExit(f"install_local: {name} is not a distribution of this repository")
        folders.append(str(local[name]))
    if folders:
        print("install_local (--no-deps):", " ".join(folders), flush=True)
        subprocess.run([*pip, "--no-deps", *folders], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
