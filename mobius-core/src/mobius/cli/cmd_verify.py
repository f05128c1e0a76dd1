"""``mobius verify PACKAGE``: is a package intact and self-consistent?

Checks every file against the sha256 and size in ``mobius.json`` and the
manifest's pipeline contract against the graphs
(:func:`mobius.package.verify_package`). Prints ``OK`` or one line per problem,
each naming the file (or ``contract:``), and exits 0 or 1, so scripts can gate
on it before shipping or loading a package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mobius.cli._common import DEBUG_HELP, user_errors


def _checked_files(root: Path) -> int | None:
    """How many files the manifest lists (for the OK line); None if it cannot say."""
    from mobius.errors import PackageError
    from mobius.package import read_package

    try:
        manifest = read_package(root).manifest
    except PackageError:
        return None
    components = manifest.get("components") or {}
    n = sum(1 + isinstance(entry.get("data"), str) for entry in components.values())
    return n + len(manifest.get("files") or {})


def report(root: Path, problems: list[str]) -> dict[str, Any]:
    """The JSON object of ``mobius verify --json``."""
    return {"path": str(root), "ok": not problems, "problems": problems}


def register(app: typer.Typer) -> None:
    """Add the ``verify`` command to ``app``."""

    @app.command("verify")
    def verify(
        ctx: typer.Context,
        package: Annotated[str, typer.Argument(help="A package folder written by mobius build.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
        debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
    ) -> None:
        """Check PACKAGE in full, as Pipeline.load relies on it: every file against its
        manifest (size, then sha256), every path and external-data reference inside the
        package, the contract against the graphs, tokenizer and config; exit 1 listing
        every problem. A clean check refreshes the package's verification stamp."""
        with user_errors(ctx, debug):
            from mobius.package import verify_package

            root = Path(package).expanduser().absolute()
            problems = verify_package(root)
        if as_json:
            import json

            typer.echo(json.dumps(report(root, problems), indent=2))
        elif problems:
            typer.echo(f"FAILED {root}: {len(problems)} problem(s)")
            for problem in problems:
                lines = problem.splitlines() or [""]
                typer.echo(f"  - {lines[0]}")
                for line in lines[1:]:
                    typer.echo(f"    {line.strip()}")
        else:
            n = _checked_files(root)
            files = f"{n} files match mobius.json" if n is not None else "files match mobius.json"
            typer.echo(f"OK {root}: {files}; the contract matches the graphs")
        if problems:
            raise typer.Exit(code=1)
