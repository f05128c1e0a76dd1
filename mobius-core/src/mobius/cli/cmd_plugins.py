"""``mobius plugins``: which plugins are installed, what they build, which failed and why.

Plain text, not a rich table: the command must start fast (rich's table and markup
cost a tenth of a second) and read well at 80 columns. One line per plugin; the
model types wrap at commas under their own column, and a reason (failed or
incompatible plugins) follows on its own indented lines.
"""

from __future__ import annotations

import textwrap

import typer

from mobius.cli._common import DEBUG_HELP, get_host, user_errors

COLUMNS = ("name", "distribution", "version", "status", "model types")
MIN_TYPES_WIDTH = 20
"""Narrowest the model-types column gets; below that it moves to its own lines."""


def render(records: list, width: int) -> str:
    """The plugin listing for a terminal ``width`` columns wide."""
    rows = [
        (r.name, r.distribution or "-", r.version or "-", r.status, list(r.model_types))
        for r in records
    ]
    fixed = [
        max(len(COLUMNS[i]), *(len(row[i]) for row in rows)) if rows else len(COLUMNS[i])
        for i in range(4)
    ]
    indent = sum(fixed) + 2 * len(fixed)
    types_width = max(MIN_TYPES_WIDTH, width - indent)
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS[:4], fixed)) + "  " + COLUMNS[4]]
    for record, row in zip(records, rows):
        head = "  ".join(c.ljust(w) for c, w in zip(row[:4], fixed)) + "  "
        types = _wrap_types(row[4], types_width)
        if indent + types_width > width:  # too narrow: types on their own lines
            lines.append(head.rstrip())
            if row[4]:
                lines += ["    " + t for t in _wrap_types(row[4], max(10, width - 4))]
        else:
            lines.append(head + types[0])
            lines += [" " * indent + t for t in types[1:]]
        if record.reason:
            lines += textwrap.wrap(
                record.reason,
                max(20, width),
                initial_indent="    reason: ",
                subsequent_indent="            ",
                break_on_hyphens=False,
            )
    return "\n".join(line.rstrip() for line in lines)


def _wrap_types(types: list[str], width: int) -> list[str]:
    """``a, b, c`` broken only after commas (a model type is never split)."""
    if not types:
        return ["-"]
    lines: list[str] = []
    current = ""
    for i, name in enumerate(types):
        piece = name + ("," if i < len(types) - 1 else "")
        candidate = f"{current} {piece}" if current else piece
        if current and len(candidate) > width:
            lines.append(current)
            current = piece
        else:
            current = candidate
    lines.append(current)
    return lines


def register(app: typer.Typer) -> None:
    """Add the ``plugins`` command to ``app``."""

    @app.command("plugins")
    def plugins(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead."),
        debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
    ) -> None:
        """List plugins: name, distribution, version, status, model types, reason."""
        with user_errors(ctx, debug):
            records = get_host(ctx).records()
            if as_json:
                import json

                typer.echo(json.dumps([r.to_dict() for r in records], indent=2))
                return
            import shutil

            typer.echo(render(records, shutil.get_terminal_size((80, 24)).columns))
