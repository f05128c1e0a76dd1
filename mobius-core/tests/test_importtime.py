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
# ``mobius --help`` also loads every installed plugin's entry-point module and
# renders help; plugins may use numpy, but none may pull in an ONNX library,
# a runtime or the reference stack before a command actually runs.
NOT_ON_HELP = NOT_ON_IMPORT - {"numpy", "ml_dtypes"}

_PROBE = r"""
import json, sys
out = sys.argv[1]
if sys.argv[2] == "help":
    import contextlib, io
    from mobius.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(["--help"])
        except SystemExit as exc:
            code = exc.code
        else:
            code = 0
    assert code in (0, None), f"mobius --help exited {code}"
    assert "Usage" in buf.getvalue(), buf.getvalue()
else:
    import mobius.cli
with open(out, "w") as fh:
    json.dump(sorted({m.split(".", 1)[0] for m in sys.modules}), fh)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MOBIUS_PLUGINS", None)
    return env


def _modules_after(mode: str, tmp_path: Path) -> set[str]:
    out = tmp_path / f"{mode}.json"
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), mode],
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


def test_help_pulls_in_nothing_heavy(tmp_path: Path) -> None:
    loaded = _modules_after("help", tmp_path)
    assert "pluggy" in loaded
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
