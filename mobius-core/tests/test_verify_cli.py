"""``mobius verify PACKAGE``: an intact package passes; each kind of damage is named, exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_checkpoint
from typer.testing import CliRunner

import mobius
from mobius.cli import make_app
from mobius.package import MANIFEST_NAME
from mobius.plugins import PluginHost

MOBIUS = Path(sys.executable).parent / "mobius"
DATA = "model/model.onnx.data"
GRAPH = "model/model.onnx"
RUNTIME = "tinytest.txt"

IN_FEATURES, OUT_FEATURES = 16, 32
"""proj.weight is 16 x 32 float32 = 2 KiB: over the writer's inline limit, so external."""


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_tiny_checkpoint(
        tmp_path / "ckpt", in_features=IN_FEATURES, out_features=OUT_FEATURES
    )


@pytest.fixture
def package(checkpoint: Path, tmp_path: Path) -> Path:
    from plugins_for_tests import tinytest

    host = PluginHost.from_plugins({"tinytest": tinytest})
    return mobius.build(str(checkpoint), str(tmp_path / "pkg"), host=host).out


def verify(*args: str):
    return CliRunner().invoke(make_app(), ["verify", *args])


def flip_byte(path: Path, index: int = 0) -> None:
    raw = bytearray(path.read_bytes())
    raw[index] ^= 0x01
    path.write_bytes(bytes(raw))


def set_port_dtype(package: Path, dtype: str) -> None:
    """Edit the manifest's contract: the model's output ``y`` claims ``dtype``."""
    manifest = json.loads((package / MANIFEST_NAME).read_text())
    (component,) = manifest["contract"]["components"]
    assert component["outputs"][0]["name"] == "y"
    component["outputs"][0]["dtype"] = dtype
    (package / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_intact_package_is_ok(package: Path) -> None:
    result = verify(str(package))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"OK {package}")
    assert "3 files match mobius.json" in result.stdout  # graph, data, tinytest.txt

    as_json = verify(str(package), "--json")
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout) == {"path": str(package), "ok": True, "problems": []}


def test_tampered_weight_byte_is_named(package: Path) -> None:
    flip_byte(package / DATA, index=5)
    result = verify(str(package))
    assert result.exit_code == 1
    assert result.stdout.startswith(f"FAILED {package}: 1 problem(s)")
    assert f"{DATA}: sha256" in result.stdout and "does not match the manifest" in result.stdout


@pytest.mark.parametrize("gone", [RUNTIME, DATA, GRAPH])
def test_deleted_file_is_named(package: Path, gone: str) -> None:
    (package / gone).unlink()
    result = verify(str(package), "--json")
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    assert f"{gone}: missing" in problems


def test_contract_dtype_disagreeing_with_the_graph_is_named(package: Path) -> None:
    set_port_dtype(package, "float16")
    result = verify(str(package))
    assert result.exit_code == 1
    assert result.stdout.startswith(f"FAILED {package}: 1 problem(s)\n  - contract:")
    detail = result.stdout.split("contract:", 1)[1]
    assert "'model.y' has dtype float16 in the contract but float32 in graph 'model'" in detail


def test_every_problem_is_listed_at_once(package: Path) -> None:
    flip_byte(package / DATA)
    (package / RUNTIME).unlink()
    set_port_dtype(package, "bfloat16")
    result = verify(str(package), "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    problems = report["problems"]
    assert len(problems) == 3, problems
    assert any(p.startswith(f"{DATA}: sha256") for p in problems)
    assert f"{RUNTIME}: missing" in problems
    assert any(p.startswith("contract:") and "model.y" in p for p in problems)


def test_corrupted_graph_of_another_size_is_not_hashed_or_parsed(package: Path) -> None:
    """A model.onnx whose size differs from the manifest is refused on its size alone."""
    (package / GRAPH).write_bytes(b"\x08not a protobuf at all")
    problems = json.loads(verify(str(package), "--json").stdout)["problems"]
    graph_problems = [p for p in problems if p.startswith(GRAPH)]
    assert len(graph_problems) == 1 and graph_problems[0].startswith(f"{GRAPH}: size 22 bytes")
    assert not any("sha256" in p or "cannot be read" in p for p in problems)


def test_corrupted_graph_of_the_same_size_is_named_twice(package: Path) -> None:
    """A garbled model.onnx of the right size fails its hash and cannot be parsed: both named."""
    size = (package / GRAPH).stat().st_size
    (package / GRAPH).write_bytes(b"\x08" + b"\xff" * (size - 1))
    problems = json.loads(verify(str(package), "--json").stdout)["problems"]
    assert any(p.startswith(f"{GRAPH}: sha256") for p in problems)
    assert any(p.startswith(f"{GRAPH}: cannot be read as an ONNX model") for p in problems)


def test_size_change_is_named(package: Path) -> None:
    with (package / DATA).open("ab") as f:
        f.write(b"\0")
    problems = json.loads(verify(str(package), "--json").stdout)["problems"]
    assert any(p.startswith(f"{DATA}: size") and "manifest says" in p for p in problems)


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda root: (root / MANIFEST_NAME).unlink(), "no mobius.json"),
        (lambda root: (root / MANIFEST_NAME).write_text("{"), "not valid JSON"),
    ],
    ids=["no-manifest", "bad-json"],
)
def test_unreadable_manifest_fails(package: Path, damage, needle: str) -> None:
    damage(package)
    result = verify(str(package))
    assert result.exit_code == 1
    assert needle in result.stdout and "Traceback" not in result.output


def test_missing_folder_fails(tmp_path: Path) -> None:
    result = verify(str(tmp_path / "nope"))
    assert result.exit_code == 1
    assert "package folder does not exist" in result.stdout


def test_console_script(package: Path) -> None:
    if not MOBIUS.exists():
        pytest.skip(f"no console script at {MOBIUS}")
    env = dict(os.environ, MOBIUS_PLUGINS="")
    ok = subprocess.run(
        [str(MOBIUS), "verify", str(package)], capture_output=True, text=True, env=env, timeout=120
    )
    assert ok.returncode == 0 and ok.stdout.startswith("OK "), ok.stdout + ok.stderr
    flip_byte(package / DATA)
    bad = subprocess.run(
        [str(MOBIUS), "verify", str(package), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 1, bad.stderr
    assert json.loads(bad.stdout)["problems"][0].startswith(f"{DATA}: sha256")
