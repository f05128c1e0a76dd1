"""mobius-testing's README documents every `mobius golden` subcommand.

Why: `mobius golden check` (how a user checks packages against goldens) was missing from it.
"""

from __future__ import annotations

from pathlib import Path

import typer.main

from mobius_testing.golden_cli import app

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_golden_subcommand_is_in_the_readme() -> None:
    names = sorted(typer.main.get_command(app).commands)
    assert "check" in names and "regen" in names
    text = README.read_text(encoding="utf-8")
    missing = [name for name in names if f"`mobius golden {name}" not in text]
    assert not missing, f"README.md does not document: {missing}"
