"""``mobius plugins``: which plugins are installed, what they build, which failed and why."""

from __future__ import annotations

import typer

from mobius.cli._common import DEBUG_HELP, get_host, user_errors


def register(app: typer.Typer) -> None:
    """Add the ``plugins`` command to ``app``."""

    @app.command("plugins")
    def plugins(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead."),
        debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
    ) -> None:
        """List plugins: name, distribution, version, model types, status, reason."""
        with user_errors(ctx, debug):
            records = get_host(ctx).records()
            if as_json:
                import json

                typer.echo(json.dumps([r.to_dict() for r in records], indent=2))
                return
            from rich.console import Console
            from rich.table import Table

            table = Table()
            for column in ("name", "distribution", "version", "model_types", "status"):
                table.add_column(column, no_wrap=column != "model_types", overflow="fold")
            table.add_column("reason", ratio=1, overflow="fold")
            for r in records:
                style = {"ok": "green", "failed": "red", "incompatible": "yellow"}[r.status]
                table.add_row(
                    r.name,
                    r.distribution or "-",
                    r.version or "-",
                    ", ".join(r.model_types) or "-",
                    f"[{style}]{r.status}[/{style}]",
                    r.reason,
                )
            Console(soft_wrap=False).print(table)
