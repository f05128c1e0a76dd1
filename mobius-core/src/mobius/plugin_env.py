"""Where plugins come from: entry points, the ``MOBIUS_PLUGINS`` allow-list, and
whether a plugin's distribution accepts the installed ``mobius-core``.

Nothing here imports a plugin; :mod:`mobius.plugins` does, after these checks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

ENTRY_POINT_GROUP = "mobius"
ENV_ALLOW_LIST = "MOBIUS_PLUGINS"
CORE_DISTRIBUTION = "mobius-core"


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
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != CORE_DISTRIBUTION:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            ok = req.specifier.contains(Version(core), prereleases=True)
        except InvalidVersion:
            ok = True
        if not ok:
            return _incompatible_message(distribution, version, str(req.specifier), core)
    return None


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
