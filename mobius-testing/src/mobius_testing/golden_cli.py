"""``mobius golden regen|reproduce CASE...`` and ``mobius golden check [PATH...]`` (typer).

``regen`` runs the HF reference (``[reference]`` extra; the GPU when torch sees
one) and writes the L4/L5 goldens of each case. ``reproduce`` reruns the reference
and judges it against the stored goldens with the L4/L5 gates and the case's
tolerances, writing nothing (:func:`mobius_testing.regen.reproduce_case`). ``check`` runs the L4/L5 items of
case files through pytest with this package's plugin, so a CLI check and a CI
run are the same code. Without paths, ``check`` uses ``MOBIUS_CASES`` (folders
separated by ``os.pathsep``), else every folder the installed families register
in the ``mobius_testing.cases`` entry-point group (an entry point names a path,
or a callable returning one or more paths).

Registered by mobius-testing's ``mobius_add_commands``:
``app.add_typer(golden_cli.app, name="golden")``.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Optional

import typer

from mobius.errors import MobiusError

CASES_GROUP = "mobius_testing.cases"

app = typer.Typer(
    name="golden",
    help="Golden files of the L4/L5 harness: regenerate them, check packages against them.",
    no_args_is_help=True,
)


def registered_case_dirs() -> list[Path]:
    """Case folders of the installed families (``mobius_testing.cases`` entry points)."""
    found: list[Path] = []
    for ep in sorted(entry_points(group=CASES_GROUP), key=lambda e: e.name):
        value = ep.load()
        value = value() if callable(value) else value
        items = value if isinstance(value, (list, tuple)) else [value]
        found.extend(Path(str(v)) for v in items)
    return found


def default_case_paths() -> list[Path]:
    env = os.environ.get("MOBIUS_CASES")
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return registered_case_dirs()


def _fail(exc: MobiusError, ctx: typer.Context) -> None:
    """Print ``exc`` and exit 2; with ``mobius --debug`` re-raise it (the traceback shows)."""
    from mobius.cli._common import is_debug

    if is_debug(ctx):
        raise exc
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(2)


@app.command("regen")
def regen(
    ctx: typer.Context,
    cases: Annotated[list[Path], typer.Argument(help="case files (*.case.toml) or folders")],
    golden_dir: Annotated[
        Optional[Path],  # noqa: UP045 - typer needs Optional on Python 3.10
        typer.Option("--golden-dir", help="write here instead of goldens/ beside each case"),
    ] = None,
    device: Annotated[
        str, typer.Option("--device", help="reference device: auto (GPU when present), cpu, cuda")
    ] = "auto",
) -> None:
    """Write the L4/L5 goldens of CASES with the HF reference (needs the [reference] extra)."""
    from mobius_testing.cases import find_cases, load_case
    from mobius_testing.reference import missing_reference
    from mobius_testing.regen import regen_case

    reason = missing_reference()
    if reason:
        typer.echo(f"error: {reason}", err=True)
        raise typer.Exit(2)
    try:
        files = find_cases(cases)
        loaded = [load_case(f) for f in files]
    except MobiusError as exc:
        _fail(exc, ctx)
    if not loaded:
        typer.echo("error: no case files found", err=True)
        raise typer.Exit(2)
    skipped = 0
    for case in loaded:
        try:
            why = case.skip_reason()  # raises for a GGUF file with another sha256
        except MobiusError as exc:
            _fail(exc, ctx)
        if why:
            typer.echo(f"skip {case.id}: {why}")
            skipped += 1
            continue
        try:
            result = regen_case(case, golden_dir=golden_dir, device=device)
        except MobiusError as exc:
            _fail(exc, ctx)
        for path in result.written:
            typer.echo(f"wrote {path}")
        for warning in result.warnings:
            typer.echo(f"warning: {warning}")
    if skipped == len(loaded):
        raise typer.Exit(1)


@app.command("reproduce")
def reproduce(
    ctx: typer.Context,
    cases: Annotated[list[Path], typer.Argument(help="case files (*.case.toml) or folders")],
    golden_dir: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--golden-dir", help="goldens here instead of goldens/ beside each case"),
    ] = None,
    device: Annotated[
        str, typer.Option("--device", help="reference device: auto (GPU when present), cpu, cuda")
    ] = "auto",
) -> None:
    """Check that the HF reference still reproduces the stored goldens; writes nothing.

    The reference's logits and greedy ids go through the same L4/L5 gates and case
    tolerances as a package's check (not bit for bit: the CPU's vector kernels move
    float32 logits in their last bits). Exit 1 when a case fails.
    """
    from mobius_testing.cases import find_cases, load_case
    from mobius_testing.gates import FAIL
    from mobius_testing.reference import missing_reference
    from mobius_testing.regen import reproduce_case

    reason = missing_reference()
    if reason:
        typer.echo(f"error: {reason}", err=True)
        raise typer.Exit(2)
    try:
        loaded = [load_case(f) for f in find_cases(cases)]
    except MobiusError as exc:
        _fail(exc, ctx)
    if not loaded:
        typer.echo("error: no case files found", err=True)
        raise typer.Exit(2)
    failed = ran = 0
    for case in loaded:
        try:
            why = case.skip_reason()  # raises for a GGUF file with another sha256
        except MobiusError as exc:
            _fail(exc, ctx)
        if why:
            typer.echo(f"skip {case.id}: {why}")
            continue
        try:
            result = reproduce_case(case, golden_dir=golden_dir, device=device)
        except MobiusError as exc:
            _fail(exc, ctx)
        ran += 1
        failed += result.outcome == FAIL
        typer.echo(f"{case.id}: {result.report()}")
    if failed or not ran:
        raise typer.Exit(1)


@app.command("check", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def check(
    ctx: typer.Context,
    paths: Annotated[
        Optional[list[Path]],  # noqa: UP045
        typer.Argument(help="case files or folders (default: MOBIUS_CASES, installed families)"),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda")] = "auto",
    levels: Annotated[str, typer.Option("--levels", help="comma list of l4, l5")] = "l4,l5",
    families: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--families", help="comma list of families"),
    ] = None,
    golden_dir: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--golden-dir", help="golden folder (default: goldens/ beside each case)"),
    ] = None,
) -> None:
    """Check packages built from the cases against their goldens (L4/L5, via pytest).

    Extra arguments after '--' go to pytest (e.g. '-- -k small -x').
    """
    import pytest

    targets = list(paths or []) or default_case_paths()
    if not targets:
        typer.echo(
            "error: no case folders: pass case files or folders, set MOBIUS_CASES, or install a "
            f"family that registers its cases in the {CASES_GROUP!r} entry-point group",
            err=True,
        )
        raise typer.Exit(2)
    args = [str(p) for p in targets]
    args += ["--device", device, "--levels", levels, "-p", "no:cacheprovider", "-rsx"]
    if families:
        args += ["--families", families]
    if golden_dir:
        args += ["--golden-dir", str(golden_dir)]
    args += list(ctx.args)
    # the plugin is already loaded through its pytest11 entry point when installed
    code = pytest.main(args)
    raise typer.Exit(int(code))
