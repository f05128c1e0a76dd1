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


_METAVARS = {"str": "TEXT", "path": "PATH", "file": "FILE", "directory": "DIR", "bool": "BOOL"}


def tidy_help(command: Any) -> Any:
    """Give every option and argument of ``command`` (and its subcommands) a plain metavar.

    Why: typer 0.29 derives them from type annotations, so help showed
    ``--image <list[Path]>``, ``--threads <int>`` and ``{package}``. This writes the
    usual ``--image PATH`` (repeatable options say so), ``--threads INT``,
    ``--dtype [f32|f16|bf16]`` and ``PACKAGE``, for core's commands and every
    plugin's alike. A metavar a command sets itself is kept. Also keeps ``--help``
    from importing pydantic (see :func:`_bool_help_option`). Returns ``command``.
    """
    for param in getattr(command, "params", ()):
        if param.param_type_name == "argument":
            if param.metavar is None:
                param.metavar = param.name.upper()
            _plain_usage_name(param)
            continue
        if param.metavar is not None or getattr(param, "is_flag", False):
            continue
        label = param.display_type(None).strip("<>") if hasattr(param, "display_type") else ""
        if label.startswith("list[") and label.endswith("]"):
            label = label[5:-1]
        label = label.removesuffix(" range")
        if "|" in label:
            param.metavar = f"[{label}]"
        elif label:
            param.metavar = _METAVARS.get(label.lower(), label.upper())
        if getattr(param, "multiple", False) and "repeat" not in (param.help or "").lower():
            param.help = f"{(param.help or '').rstrip()} Repeat for several.".lstrip()
    _bool_help_option(command)
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)
    return command


def _bool_help_option(command: Any) -> None:
    """Make ``--help``'s unset value ``False`` instead of ``None``.

    Why: typer 0.29 coerces every parameter value that is not already a bool
    through pydantic, and the help option it makes has the default ``None``: so
    every command, ``mobius plugins`` included, imported pydantic (a third of a
    second) just to read "help not asked for".
    """
    original = getattr(command, "get_help_option", None)
    if original is None:
        return

    def get_help_option(ctx: Any) -> Any:
        option = original(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option

    command.get_help_option = get_help_option


def _plain_usage_name(param: Any) -> None:
    """``PACKAGE`` / ``[PACKAGE]`` / ``CASES...`` in the usage line (typer writes ``{package}``)."""
    name = param.metavar
    usage = name if param.required else f"[{name}]"
    if param.nargs != 1:
        usage += "..."
    param._usage_display_name = lambda: usage
    param.display_type_rich = lambda ctx=None: None  # "PACKAGE  help", not "PACKAGE <path>"


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
