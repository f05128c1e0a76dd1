"""The runtime's mobius plugin: adds ``mobius run`` to the CLI.

Import-light on purpose: the CLI imports every plugin before parsing arguments,
so onnxruntime, tokenizers and numpy are imported only inside the command.
"""

from __future__ import annotations

from typing import Any

from mobius import hookimpl


@hookimpl
def mobius_add_commands(app: Any) -> None:
    """Register ``run``."""
    from mobius_runtime.cli import run

    app.command("run", help="Generate text from a model package (streams to stdout).")(run)
