"""Verifying a package in full: ``mobius verify`` and :func:`verify_package`."""

from __future__ import annotations

import os

from mobius.package.checks import check_package


def verify_package(path: str | os.PathLike[str]) -> list[str]:
    """Every problem found in a package, one line each; an empty list means it is intact.

    Runs :func:`mobius.package.checks.check_package` without trusting a stamp:
    every file is hashed (after its size matched the manifest), every
    external-data reference is confined to the package, the graphs are checked
    against the contract. When all is well it refreshes the package's
    verification stamp, so the next ``Pipeline.load`` need not hash again.
    """
    return check_package(path, trust_stamp=False).problems
