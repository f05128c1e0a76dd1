"""Where plugins come from: entry points, the ``MOBIUS_PLUGINS`` allow-list, and
whether a plugin's distribution accepts the installed ``mobius-core``.

Nothing here imports a plugin; :mod:`mobius.plugins` does, after these checks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

ENTRY_POINT_GROUP = "mobius"
ENV_ALLOW_LIST = "MOBIUS_PLUGINS"
CORE_DISTRIBUTION = "mobius-core"


REPOSITORY_MODEL_TYPES: dict[str, str] = {
    "gemma4": "mobius-gemma4",
    "gemma4_text": "mobius-gemma4",
    "gemma4_unified": "mobius-gemma4",
    "qwen3": "mobius-qwen3",
    "qwen3_moe": "mobius-qwen3",
}
"""model_type -> the distribution of this repository that builds it (for install hints only;
a test checks it against what the installed family plugins declare)."""

REPOSITORY_COMMANDS: dict[str, str] = {
    "run": "mobius-runtime",
    "chat": "mobius-runtime",
    "serve": "mobius-runtime",
    "golden": "mobius-testing",
    "harness": "mobius-testing",
}
"""``mobius`` subcommand -> the distribution of this repository that adds it."""


def install_hint(distribution: str, extra: str | None = None) -> str:
    """How to install ``distribution`` (a folder of this repository) today.

    Why: the hints named PyPI distributions (``pip install mobius-qwen3``) that are not
    published yet, so following them failed; until a release is on PyPI the folder form
    from a clone of the repository is the one that works.
    """
    target = f"./{distribution}[{extra}]" if extra else f"./{distribution}"
    if extra:
        target = f'"{target}"'
    return f"pip install {target} (from a clone of the mobius repository; not on PyPI yet)"


def family_install_hint(model_type: str | None) -> str:
    """The install hint for the family plugin that builds ``model_type``, named when known."""
    distribution = REPOSITORY_MODEL_TYPES.get(model_type or "")
    if distribution is not None:
        return f"install the {distribution} plugin: {install_hint(distribution)}"
    return (
        f"install the plugin of the family that builds model_type {model_type!r} "
        "(this repository ships mobius-gemma4 and mobius-qwen3: pip install ./mobius-<family> "
        "from a clone of it)"
    )


def list_entry_points() -> list[Any]:
    """The installed entry points of group ``mobius`` (tests monkeypatch this)."""
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


def core_version() -> str:
    """The installed ``mobius-core`` version (metadata first, the package as fallback)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(CORE_DISTRIBUTION)
    except PackageNotFoundError:
        from mobius import __version__

        return __version__


def allow_list() -> set[str] | None:
    """Entry-point names allowed by ``MOBIUS_PLUGINS``; ``None`` when unset (all allowed)."""
    raw = os.environ.get(ENV_ALLOW_LIST)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _dist_of(entry_point: Any) -> tuple[str | None, str | None, list[str]]:
    """(distribution name, version, Requires-Dist lines) of an entry point, when known."""
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None, None, []
    try:
        name = dist.metadata["Name"]
    except Exception:
        name = getattr(dist, "name", None)
    return name, getattr(dist, "version", None), list(getattr(dist, "requires", None) or [])


def incompatibility(
    distribution: str | None, requires: Iterable[str], core: str, version: str | None = None
) -> str | None:
    """Why ``distribution`` (at ``version``) cannot run with core ``core``, or ``None``.

    Reads the distribution's ``Requires-Dist`` lines; only an unconditional
    requirement on ``mobius-core`` (or one whose marker holds here, extras
    excluded) counts. The message names the plugin's version, the range it
    requires, the installed core and the ``pip install`` that fixes it, since
    the person reading it is usually one command away from a working install.
    """
    from packaging.version import InvalidVersion, Version

    for line in requires:
        spec = _core_specifier(line)
        if spec is None:
            continue
        try:
            ok = spec.contains(Version(core), prereleases=True)
        except InvalidVersion:
            ok = True
        if not ok:
            return _incompatible_message(distribution, version, str(spec), core)
    return None


_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_PLAIN = re.compile(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*\(?([^;()\[\]]*)\)?\s*")


def _core_specifier(line: str) -> Any:
    """The SpecifierSet of a Requires-Dist line on ``mobius-core`` that applies here, or None.

    Why not always ``packaging.requirements.Requirement``: importing it costs about
    50 ms of every CLI start (its grammar), and ``mobius plugins`` must start fast.
    Lines on other distributions are skipped by name, and a plain line
    (``mobius-core<0.2,>=0.1``, no extras, no marker) needs only
    ``packaging.specifiers``; anything else goes through the full parser.
    """
    name = _NAME.match(line)
    if name is None or re.sub(r"[-_.]+", "-", name.group(1)).lower() != CORE_DISTRIBUTION:
        return None
    plain = _PLAIN.fullmatch(line)
    if plain is not None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            return SpecifierSet(plain.group(1).strip())
        except InvalidSpecifier:
            return None
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(line)
    except InvalidRequirement:
        return None
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return None
    return req.specifier


def _incompatible_message(
    distribution: str | None, version: str | None, spec: str, core: str
) -> str:
    """The ``incompatible`` reason: both versions, the range, and the command that fixes it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    who = f"{distribution} {version}" if distribution and version else distribution
    who = who or "this plugin"
    installed = Version(core)
    # core above the plugin's upper bound: a newer plugin release may support it
    too_new = any(
        s.operator in ("<", "<=") and not s.contains(installed, prereleases=True)
        for s in SpecifierSet(spec)
    )
    message = (
        f"{who} requires mobius-core{spec}, but mobius-core {core} is installed; "
        f"fix: pip install 'mobius-core{spec}' (replaces mobius-core {core})"
    )
    if too_new and distribution:
        message += f", or keep it and upgrade the plugin: pip install -U {distribution}"
    return message
