"""The runtime's mobius plugin: adds ``mobius run``, ``mobius chat`` and ``mobius serve``.

Import-light on purpose: the CLI imports every plugin before parsing arguments,
so onnxruntime, tokenizers and numpy are imported only inside the command.
"""

from __future__ import annotations

from typing import Any

from mobius import hookimpl


@hookimpl
def mobius_add_commands(app: Any) -> None:
    """Register ``run``, ``chat`` and ``serve``."""
    from mobius_runtime.cli import chat, run
    from mobius_runtime.serve.cli import serve

    app.command("run", help="Generate text from a model package for one message.")(run)
    app.command("chat", help="Chat with a model package, turn by turn (keeps the KV cache).")(chat)
    app.command(
        "serve", help="Serve a package over the OpenAI HTTP API (needs mobius-runtime[serve])."
    )(serve)
