"""``import mobius.cli`` and ``mobius --help`` stay light.

The CLI starts on every command, so what it imports up front is paid every time.
The project rule is no timed assertions in tests (a loaded machine would make them
flaky); instead these tests pin *which* heavy libraries must not be imported,
which is what keeps start-up fast, and print the ``-X importtime`` figure for the
record. ``benchmarks/cli_import.py`` reports the timing properly (median of runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Heavy libraries the bare import must not touch: the ONNX stack, runtimes,
# the reference stack, and the numeric/IO libraries only a build needs.
NOT_ON_IMPORT = {
    "onnx",
    "onnxscript",
    "onnx_ir",
    "onnxruntime",
    "onnxruntime_genai",
    "torch",
    "transformers",
    "tokenizers",
    "numpy",
    "ml_dtypes",
    "safetensors",
    "huggingface_hub",
}
# ``mobius --help``, every command's ``--help`` and ``mobius plugins`` load every
# installed plugin's entry-point module; none of that may pull in the ONNX stack,
# a runtime, numpy/ml_dtypes, media or tokenizer libraries (issue: ml_dtypes alone
# cost 1.3 s of a 1.7 s ``--help``). Plugin modules must import these lazily.
NOT_ON_HELP = NOT_ON_IMPORT | {"PIL", "soundfile", "jinja2", "fastapi", "uvicorn"}

_PROBE = r"""
import contextlib, io, json, sys
out, mode, *args = sys.argv[1:]


def run(argv):
    from mobius.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
        else:
            code = 0
    assert code in (0, None), f"mobius {' '.join(argv)} exited {code}: {buf.getvalue()}"
    return buf.getvalue()


if mode == "cli":
    text = run(args)
    assert text.strip(), f"mobius {' '.join(args)} printed nothing"
elif mode == "every-help":
    # every command of the real app (core's and the installed plugins'), groups included
    import typer.main
    from mobius.cli import make_app
    from mobius.plugins import PluginHost

    app = make_app()
    PluginHost.load().add_commands(app)
    todo, seen = [((), typer.main.get_command(app))], []
    while todo:
        path, command = todo.pop()
        assert "Usage" in run([*path, "--help"]), path
        seen.append(" ".join(path) or "mobius")
        if hasattr(command, "commands"):  # a group (typer vendors its own click)
            todo += [((*path, n), c) for n, c in command.commands.items()]
    expected = {"mobius", "build", "plugins", "inspect", "verify"}
    assert expected <= set(seen), seen
else:
    import mobius.cli
with open(out, "w") as fh:
    json.dump(sorted({m.split(".", 1)[0] for m in sys.modules}), fh)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MOBIUS_PLUGINS", None)
    return env


def _modules_after(mode: str, tmp_path: Path, *args: str) -> set[str]:
    out = tmp_path / f"{mode}.json"
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), mode, *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return set(json.loads(out.read_text()))


def cumulative_us(importtime_stderr: str, module: str) -> int:
    """Cumulative microseconds of ``module`` in ``python -X importtime`` output."""
    for line in importtime_stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = [p.strip() for p in line[len("import time:") :].split("|")]
        if len(parts) == 3 and parts[2] == module and parts[1].isdigit():
            return int(parts[1])
    raise LookupError(f"{module} not in -X importtime output")


def test_import_cli_pulls_in_nothing_heavy(tmp_path: Path) -> None:
    loaded = _modules_after("import", tmp_path)
    assert "typer" in loaded and "mobius" in loaded
    assert loaded & NOT_ON_IMPORT == set()


@pytest.mark.parametrize("args", [["--help"], ["plugins"], ["plugins", "--json"]], ids=" ".join)
def test_help_and_plugins_pull_in_nothing_heavy(tmp_path: Path, args: list[str]) -> None:
    loaded = _modules_after("cli", tmp_path, *args)
    assert "pluggy" in loaded
    assert loaded & NOT_ON_HELP == set()


def test_every_commands_help_pulls_in_nothing_heavy(tmp_path: Path) -> None:
    loaded = _modules_after("every-help", tmp_path)
    assert "typer" in loaded
    assert loaded & NOT_ON_HELP == set()


def test_importtime_is_reported() -> None:
    """Parse and print the figure (no threshold here: see benchmarks/cli_import.py)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import mobius.cli"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    micros = cumulative_us(done.stderr, "mobius.cli")
    assert micros > 0
    print(f"import mobius.cli: {micros / 1e6:.3f} s cumulative (-X importtime)")


def test_cumulative_parser() -> None:
    sample = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       833 |        833 |   mobius.cli.cmd_plugins\n"
        "import time:      1401 |     109400 | mobius.cli\n"
    )
    assert cumulative_us(sample, "mobius.cli") == 109400
    with pytest.raises(LookupError):
        cumulative_us(sample, "mobius")
