"""What ``--help``, ``mobius plugins`` and the build progress print: no markup eaten,
plain metavars, model types never split across lines, no "0/0 tensors" bar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer
import typer.main
from conftest import ep
from typer.testing import CliRunner

from mobius.cli import make_app
from mobius.cli._common import tidy_help
from mobius.cli.cmd_build import RichProgress
from mobius.cli.cmd_plugins import render
from mobius.plugins import PluginHost, PluginRecord


@pytest.fixture(autouse=True)
def _columns(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def help_of(app: typer.Typer, *args: str) -> str:
    """``mobius ARGS --help`` as :func:`mobius.cli.main` runs it (tidied click command)."""
    import contextlib
    import io

    command = tidy_help(typer.main.get_command(app))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = command.main([*args, "--help"], prog_name="mobius", standalone_mode=False)
    assert code in (0, None), out.getvalue()
    return out.getvalue()


def sample_app() -> typer.Typer:
    """A command shaped like the runtime's ``run`` (flags, a list of paths, a [bracket])."""
    app = make_app()

    @app.command("sample")
    def sample(
        package: Annotated[Path, typer.Argument(help="Package folder.")],
        image: Annotated[
            Optional[list[Path]],  # noqa: UP045 - the shape plugins write
            typer.Option("--image", help="Image file."),
        ] = None,
        threads: Annotated[Optional[int], typer.Option("--threads")] = None,  # noqa: UP045
        sample: Annotated[bool, typer.Option("--sample", help="Sample instead of greedy.")] = False,
    ) -> None:
        """Needs the [reference] extra."""

    return app


def test_help_shows_brackets_and_plain_metavars() -> None:
    text = help_of(sample_app(), "sample")
    assert "Needs the [reference] extra." in text
    assert "Usage: mobius sample [OPTIONS] PACKAGE" in text
    assert "--image PATH" in text and "Repeat for several." in text
    assert "--threads INT" in text
    for wrong in ("<bool>", "<list[", "<path>", "<int>", "{package}"):
        assert wrong not in text, (wrong, text)
    assert "--sample " in text and "--sample BOOL" not in text


@pytest.mark.parametrize("args", [(), ("build",), ("verify",), ("inspect",), ("plugins",)])
def test_core_help_has_no_typer_type_labels(args: tuple[str, ...]) -> None:
    text = help_of(make_app(), *args)
    assert "<" not in text and "{" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text


def test_verify_help_has_no_hard_line_break() -> None:
    """Each command is one line of the command list (the docstring's line break is not kept)."""
    text = help_of(make_app())
    listed = text[text.index("Commands:") :].splitlines()[1:]
    names = [line.split()[0] for line in listed if line.strip()]
    assert names == ["plugins", "build", "inspect", "verify"], text
    full = " ".join(help_of(make_app(), "verify").split())
    assert "every path and external-data reference inside the package, the contract" in full


def record(name: str, types: tuple[str, ...], status: str = "ok", reason: str = "") -> PluginRecord:
    return PluginRecord(
        name=name,
        distribution=f"dist-{name}",
        version="1.0",
        model_types=types,
        status=status,
        reason=reason,
    )


TYPES = ("gemma4", "gemma4_text", "gemma4_unified", "qwen3", "qwen3_moe", "llama")


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_plugins_listing_never_splits_a_model_type(width: int) -> None:
    reason = "failed at import: " + "x " * 60
    text = render([record("gemma4", TYPES), record("broken", (), "failed", reason.strip())], width)
    words = text.replace(",", " ").split()
    for model_type in TYPES:
        assert model_type in words, (model_type, text)
    assert all(len(line) <= max(width, 60) for line in text.splitlines()), text
    assert "reason: failed at import" in text


def test_plugins_command_lists_every_plugin(entry_points) -> None:
    entry_points([ep("tinytest", "plugins_for_tests.tinytest")])
    host = PluginHost.load()
    result = CliRunner().invoke(make_app(), ["plugins"], obj={"host": host}, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["name", "distribution", "version", "status", "model", "types"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["tinytest"][-1] == "tinytest" and rows["tinytest"][-2] == "ok"
    assert json.loads(
        CliRunner().invoke(make_app(), ["plugins", "--json"], obj={"host": host}).stdout
    )


def test_a_component_without_external_tensors_gets_a_line_not_an_empty_bar(capsys) -> None:
    with RichProgress() as progress:
        progress.component_started("model", 0)
        progress.component_finished("model")
    err = capsys.readouterr().err
    assert "0/0" not in err and "0 B" not in err
    assert "model: no tensor large enough for external data" in err
