"""The ``mobius`` command line (typer).

``import mobius.cli`` must stay cheap (``mobius --help`` never imports onnx,
onnxscript, onnxruntime or torch): the command modules import only typer, and
every command imports its machinery inside its body. :func:`main` loads the
plugins, lets them add commands (``mobius_add_commands``), then runs the app.
Help is plain click text (``rich_markup_mode=None``): rich markup swallowed
``[reference]`` in help strings and rich's help renderer costs start-up time;
:func:`~mobius.cli._common.tidy_help` gives every parameter a plain metavar.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer
import typer.core
import typer.main

from mobius.cli import cmd_build, cmd_inspect, cmd_plugins, cmd_verify
from mobius.cli._common import format_error, tidy_help, version_callback


def make_app() -> typer.Typer:
    """A fresh app with core's commands (tests build one per case; plugins add to it)."""
    app = typer.Typer(
        name="mobius",
        help="Build HuggingFace checkpoints into ready-to-run ONNX model packages.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def root(
        ctx: typer.Context,
        version: bool = typer.Option(
            False,
            "--version",
            is_eager=True,
            callback=version_callback,
            help="Show mobius-core's version and every plugin's, then exit.",
        ),
        debug: bool = typer.Option(
            False, "--debug", help="Show tracebacks for errors (every command)."
        ),
    ) -> None:
        """Build HuggingFace checkpoints into ready-to-run ONNX model packages."""
        state = ctx.ensure_object(dict)
        state["debug"] = debug

    cmd_plugins.register(app)
    cmd_build.register(app)
    cmd_inspect.register(app)
    cmd_verify.register(app)
    return app


app = make_app()
"""Core's app, without plugin commands (``main`` builds its own and adds them)."""


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point ``mobius``: load plugins, add their commands, run."""
    import sys

    from mobius.errors import MobiusError
    from mobius.plugins import PluginHost

    args = list(argv) if argv is not None else sys.argv[1:]
    full = make_app()
    try:
        host = PluginHost.load()
    except MobiusError as exc:  # per-plugin failures are recorded; this is the host itself
        if "--debug" in args:
            raise
        typer.echo(format_error(exc), err=True)
        raise SystemExit(1) from None
    host.add_commands(full)
    command = tidy_help(typer.main.get_command(full))
    _refuse_missing_command(args, command, host)
    command(args=args, prog_name="mobius", obj={"host": host})


def _refuse_missing_command(args: list[str], command: typer.core.TyperGroup, host: Any) -> None:
    """Explain an unknown command that a plugin would add; exit 2.

    Why: with ``MOBIUS_PLUGINS=gemma4``, or without mobius-runtime installed,
    ``mobius run`` answered only "No such command 'run'" with no hint of what to
    install. Says which distribution adds the command, and whether it is missing,
    failed to load, or is kept out by ``MOBIUS_PLUGINS``.
    """
    import os

    from mobius.plugin_env import REPOSITORY_COMMANDS, install_hint
    from mobius.plugins import ENV_ALLOW_LIST, hidden_by_allow_list

    name = next((a for a in args if not a.startswith("-")), None)
    if name is None or name in command.commands:
        return
    hidden = hidden_by_allow_list()
    if not hidden:
        distribution = REPOSITORY_COMMANDS.get(name)
        if distribution is None:
            return
        broken = [r for r in host.records() if r.distribution == distribution and r.status != "ok"]
        if broken:
            record = broken[0]
            typer.echo(
                f"error: no command {name!r}: it comes with {distribution}, whose plugin "
                f"{record.name!r} is installed but {record.status} ({record.reason})\n"
                f"  fix: see `mobius plugins`; reinstall it: {install_hint(distribution)}",
                err=True,
            )
        else:
            typer.echo(
                f"error: no command {name!r}: it comes with {distribution}, which is not "
                f"installed\n  fix: {install_hint(distribution)}",
                err=True,
            )
        raise SystemExit(2)
    typer.echo(
        f"error: no command {name!r}; {ENV_ALLOW_LIST}={os.environ.get(ENV_ALLOW_LIST, '')!r} "
        f"keeps these installed plugins from loading, and with them their commands: "
        f"{', '.join(hidden)}\n"
        f"  fix: unset {ENV_ALLOW_LIST}, or add the plugin that provides {name!r} to it",
        err=True,
    )
    raise SystemExit(2)
