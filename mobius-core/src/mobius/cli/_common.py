"""What every command shares: the plugin host, the debug switch, error printing.

Errors a user caused (:class:`~mobius.errors.MobiusError`) print as three short
lines on stderr and exit 1; ``--debug`` (global or per command) re-raises them
so the traceback shows. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from mobius.plugins import PluginHost

DEBUG_HELP = "Show the traceback of an error."


def state(ctx: typer.Context) -> dict[str, Any]:
    """The shared dict the app carries in ``ctx.obj`` (host, debug)."""
    root = ctx.find_root()
    if root.obj is None:
        root.obj = {}
    return root.obj


def get_host(ctx: typer.Context) -> PluginHost:
    """The plugin host of this invocation, loaded on first use."""
    shared = state(ctx)
    host = shared.get("host")
    if host is None:
        from mobius.plugins import PluginHost

        host = PluginHost.load()
        shared["host"] = host
    return host


def is_debug(ctx: typer.Context, flag: bool = False) -> bool:
    """Whether tracebacks were asked for, globally or on this command."""
    return flag or bool(state(ctx).get("debug"))


def format_error(exc: Any) -> str:
    """The short form of a MobiusError: ``error: what`` + where + fix."""
    lines = [f"error: {exc.what}"]
    if exc.where:
        lines.append(f"  where: {exc.where}")
    if exc.fix:
        lines.append(f"  fix: {exc.fix}")
    return "\n".join(lines)


@contextlib.contextmanager
def user_errors(ctx: typer.Context, debug: bool = False) -> Iterator[None]:
    """Turn a MobiusError into a short message and exit code 1 (unless debugging)."""
    from mobius.errors import MobiusError

    try:
        yield
    except MobiusError as exc:
        if is_debug(ctx, debug):
            raise
        typer.echo(format_error(exc), err=True)
        raise typer.Exit(code=1) from None


def version_callback(ctx: typer.Context, value: bool) -> None:
    """``mobius --version``: core and every plugin with its version, then exit."""
    if not value or ctx.resilient_parsing:
        return
    from mobius.plugins import core_version

    typer.echo(f"mobius-core {core_version()}")
    for record in get_host(ctx).records():
        dist = record.distribution or "?"
        line = f"  {record.name}: {dist} {record.version or '?'}"
        if record.status != "ok":
            line += f" ({record.status})"
        typer.echo(line)
    raise typer.Exit()
