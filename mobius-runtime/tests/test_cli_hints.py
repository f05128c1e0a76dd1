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
    if command == "serve":  # without the [serve] extra, serve stops at its own hint first
        pytest.importorskip("uvicorn")
        pytest.importorskip("fastapi")
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


MOBIUS = Path(sys.executable).parent / "mobius"


@pytest.mark.parametrize(("kind", "name"), [("image", "bad.png"), ("audio", "bad.wav")])
def test_chat_drops_media_that_fails_to_decode_and_keeps_the_conversation(
    tiny_mm_package, tmp_path: Path, kind: str, name: str
) -> None:
    """Was: the file stayed pending, so every later turn failed until /reset."""
    import subprocess

    bad = tmp_path / name
    bad.write_bytes(b"not a media file at all")
    script = f"hello\n/{kind} {bad}\nlook\nand now?\n"
    cmd = [str(MOBIUS), "chat", str(tiny_mm_package), "--max-new-tokens", "3", "--stats"]
    cmd += ["--device", "cpu"]
    run = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("error: ") == 1, run.stderr  # only the turn with the file
    assert "BytesIO" not in run.stderr and str(bad) in run.stderr
    assert f"(dropped {kind} {bad}; the conversation is kept" in run.stderr
    cached = [int(line.split("; ")[1].split()[0]) for line in run.stderr.splitlines()
              if line.startswith("[turn prefilled")]  # fmt: skip
    assert len(cached) == 2 and cached[1] > cached[0], run.stderr  # turn 1 is still there
