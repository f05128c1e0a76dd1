"""What a new user ran into with `mobius run/chat/serve`: --debug, install hints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mobius.cli import make_app
from mobius.errors import PackageError
from mobius_runtime import plugin


@pytest.fixture
def app():
    app = make_app()
    plugin.mobius_add_commands(app)
    return app


ARGS = {"run": ["--prompt", "hi"], "chat": [], "serve": []}


@pytest.mark.parametrize("command", sorted(ARGS))
def test_root_debug_shows_the_traceback(app, tmp_path: Path, command: str) -> None:
    """The root help says --debug works for every command; run/chat/serve ignored it."""
    missing = str(tmp_path / "no-such-package")
    plain = CliRunner().invoke(app, [command, missing, *ARGS[command]], obj={})
    assert plain.exit_code == 1 and "does not exist" in plain.stderr
    assert not isinstance(plain.exception, PackageError)
    debug = CliRunner().invoke(app, ["--debug", command, missing, *ARGS[command]], obj={})
    assert isinstance(debug.exception, PackageError), debug.output
    assert "does not exist" in str(debug.exception)


def test_serve_without_its_extra_names_the_folder_to_install(
    app, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Was `pip install "mobius-runtime[serve]"`, which names no published distribution."""
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    result = CliRunner().invoke(app, ["serve", str(tmp_path)], obj={})
    assert result.exit_code == 1, result.output
    assert "needs FastAPI and uvicorn" in result.stderr
    assert 'fix: pip install "./mobius-runtime[serve]" (from a clone of' in result.stderr
