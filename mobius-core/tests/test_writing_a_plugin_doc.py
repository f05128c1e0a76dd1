"""docs/writing-a-plugin.md section 4 works as written: its commands, run in order.

The block after the doc's ``test_writing_a_plugin_doc.py`` marker is executed line by
line with bash from a scratch folder that sees the repository's ``examples/`` (so
``out/`` lands in ``tmp_path``). One line is not run verbatim: the ``pip install``
(tests never install into the environment). It is checked to name the folders the
example needs, and replaced by what pip would leave behind for the example: a
``mobius_example_mlp-<version>.dist-info`` with the entry points and requirements of
its ``pyproject.toml`` next to its source on ``PYTHONPATH`` (mobius-core and
mobius-runtime are already installed where this test runs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "writing-a-plugin.md"
EXAMPLE = REPO / "examples" / "mobius-example-mlp"
MARKER = "test_writing_a_plugin_doc.py runs the commands of the next block"
PIP_LINE = "pip install ./mobius-core ./mobius-runtime './examples/mobius-example-mlp[scripts]'"


def doc_commands() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    assert MARKER in text, f"{DOC.name} lost its tested block marker"
    block = re.search(r"```bash\n(.*?)```", text[text.index(MARKER) :], re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def fake_install(site: Path) -> None:
    """What ``pip install ./examples/mobius-example-mlp`` records: metadata + entry points."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    info = site / f"mobius_example_mlp-{project['version']}.dist-info"
    info.mkdir(parents=True)
    requires = "".join(f"Requires-Dist: {r}\n" for r in project["dependencies"])
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
        + requires,
        encoding="utf-8",
    )
    eps = "".join(f"{k} = {v}\n" for k, v in project["entry-points"]["mobius"].items())
    (info / "entry_points.txt").write_text(f"[mobius]\n{eps}", encoding="utf-8")


def test_section_4_builds_and_runs_the_example(tmp_path: Path) -> None:
    commands = doc_commands()
    assert commands[0] == PIP_LINE
    pytest.importorskip("mobius_runtime")
    pytest.importorskip("safetensors")
    work = tmp_path / "repo"
    work.mkdir()
    (work / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    fake_install(tmp_path / "site")
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path / "site"), str(EXAMPLE / "src")]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["COLUMNS"] = "200"
    env.pop("MOBIUS_PLUGINS", None)
    outputs = {}
    for command in commands[1:]:
        run = subprocess.run(
            ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, (
            f"{command!r} exited {run.returncode}:\n{run.stdout}{run.stderr}"
        )
        outputs[command.split()[1] if command.startswith("mobius") else command] = run.stdout
    row = [line for line in outputs["plugins"].splitlines() if "mobius-example-mlp" in line]
    assert len(row) == 1 and re.search(r"\btinymlp\b.*\b0\.1\.0\b.*\bok\b", row[0]), row
    assert "built tinymlp package" in outputs["build"]
    assert "features" in outputs["inspect"] and "logits" in outputs["inspect"]
    last = outputs[commands[-1]].strip().splitlines()[-1]
    delta = float(last.rsplit("=", 1)[1])
    assert last.startswith("max |logits - numpy| = ") and delta <= 1e-5
    assert (work / "out" / "tinymlp" / "mobius.json").is_file()
