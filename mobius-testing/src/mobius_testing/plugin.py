"""The ``mobius`` entry point of mobius-testing: adds ``mobius harness`` and ``mobius golden``.

Import-light on purpose (only ``mobius.hookspecs`` and, inside the command,
typer): the CLI imports every plugin module before it parses arguments, so
anything heavy here would slow down ``mobius --help``. Whether the
``[reference]`` extra is installed is found with ``importlib.util.find_spec``,
which locates torch and transformers without importing them.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from mobius import hookimpl

if TYPE_CHECKING:
    import typer

LEVELS: tuple[tuple[str, str, str, str], ...] = (
    ("L1", "build", "tiny configs build; onnx.checker + shape inference; contract validates", "-"),
    (
        "L2",
        "architecture",
        "full-size real configs build without weights; ports, KV geometry, parameter counts",
        "config files",
    ),
    (
        "L3",
        "synthetic parity",
        "tiny random checkpoints, ONNX Runtime vs HF torch (logits, sub-models, decode)",
        "[reference] extra",
    ),
    ("L4", "golden logits", "real checkpoint, one prefill vs stored golden", "weights, GPU"),
    ("L5", "golden generation", "real checkpoint, greedy ids vs stored golden", "weights, GPU"),
)
"""(level, name, what it checks, what it needs) of the golden harness."""

REFERENCE_MODULES = ("torch", "transformers")


def reference_available() -> dict[str, bool]:
    """Which ``[reference]`` modules are importable, without importing them."""
    found = {}
    for name in REFERENCE_MODULES:
        try:
            found[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found[name] = False
    return found


def harness_report() -> str:
    """The text ``mobius harness`` prints."""
    lines = ["mobius golden harness levels (pytest markers l1..l5):"]
    for level, name, checks, needs in LEVELS:
        lines.append(f"  {level} {name}: {checks} (needs: {needs})")
    found = reference_available()
    state = "installed" if all(found.values()) else "missing"
    detail = ", ".join(f"{n} {'found' if ok else 'missing'}" for n, ok in found.items())
    lines.append(f"[reference] extra: {state} ({detail})")
    if state == "missing":
        lines.append("  L3 needs it: pip install 'mobius-testing[reference]'")
    return "\n".join(lines)


@hookimpl
def mobius_add_commands(app: typer.Typer) -> None:
    """Add ``mobius harness`` (the levels, whether L3 can run here) and ``mobius golden``."""
    from mobius_testing.golden_cli import app as golden_app

    app.add_typer(golden_app, name="golden")

    @app.command("harness")
    def harness() -> None:
        """List the golden-harness levels L1-L5 and whether [reference] is installed."""
        import typer

        typer.echo(harness_report())
