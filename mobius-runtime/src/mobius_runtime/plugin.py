"""The runtime's mobius plugin: adds ``mobius run`` and ``mobius serve`` to the CLI.

Import-light on purpose: the CLI imports every plugin before parsing arguments,
so onnxruntime, tokenizers and numpy are imported only inside the command.
"""

from __future__ import annotations

from typing import Any

from mobius import hookimpl


@hookimpl
def mobius_add_commands(app: Any) -> None:
    """Register ``run`` and ``serve``."""
    from mobius_runtime.cli import run
    from mobius_runtime.serve.cli import serve

    app.command("run", help="Generate text from a model package (streams to stdout).")(run)
    app.command(
        "serve", help="Serve a package over the OpenAI HTTP API (needs mobius-runtime[serve])."
    )(serve)
