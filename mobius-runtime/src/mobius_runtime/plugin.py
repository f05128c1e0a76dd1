"""The runtime's mobius plugin: adds ``mobius run`` and ``mobius chat`` to the CLI.

Import-light on purpose: the CLI imports every plugin before parsing arguments,
so onnxruntime, tokenizers and numpy are imported only inside the command.
"""

from __future__ import annotations

from typing import Any

from mobius import hookimpl


@hookimpl
def mobius_add_commands(app: Any) -> None:
    """Register ``run`` and ``chat``."""
    from mobius_runtime.cli import chat, run

    app.command("run", help="Generate text from a model package for one message.")(run)
    app.command("chat", help="Chat with a model package, turn by turn (keeps the KV cache).")(chat)
