"""The ``mobius`` CLI: plugins, --version, errors, plugin commands, import cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from conftest import ep
from typer.testing import CliRunner

from mobius.cli import main, make_app
from mobius.errors import ConfigError
from mobius.plugins import PluginHost

MOBIUS = Path(sys.executable).parent / "mobius"
KEYS = ["name", "distribution", "version", "model_types", "status", "reason"]
HEAVY = ("onnxruntime", "torch", "onnx", "onnxscript", "transformers")


def invoke(args, host=None, **kw):
    obj = {"host": host} if host is not None else None
    return CliRunner().invoke(make_app(), args, obj=obj, **kw)


@pytest.fixture
def mixed_host(entry_points) -> PluginHost:
    entry_points(
        [
            ep("broken", "plugins_for_tests.broken_import"),
            ep("tinytest", "plugins_for_tests.tinytest"),
            ep("future", "plugins_for_tests.tinytest", requires=["mobius-core>=5"]),
        ]
    )
    return PluginHost.load()


def test_plugins_json(mixed_host) -> None:
    result = invoke(["plugins", "--json"], mixed_host)
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert all(list(row) == KEYS for row in rows.values())
    assert rows["tinytest"]["status"] == "ok"
    assert rows["tinytest"]["model_types"] == ["tinytest"]
    assert rows["broken"]["status"] == "failed"
    assert "tiny plugin exploded at import" in rows["broken"]["reason"]
    assert rows["future"]["status"] == "incompatible"
    assert rows["mobius.checkpoint"]["distribution"] == "mobius-core"


def test_plugins_table(mixed_host) -> None:
    result = invoke(["plugins"], mixed_host, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for word in ("tinytest", "broken", "failed", "incompatible", "mobius-core"):
        assert word in result.stdout


def test_version_lists_core_and_plugins(mixed_host) -> None:
    result = invoke(["--version"], mixed_host)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("mobius-core ")
    assert "  tinytest: mobius-tinytest 0.1.0" in lines
    assert "  broken: mobius-broken 0.1.0 (failed)" in lines


def test_usage_errors_exit_2(tiny_host, tmp_path) -> None:
    assert invoke(["build"], tiny_host).exit_code == 2
    result = invoke(["build", str(tmp_path), str(tmp_path / "o"), "--dtype", "f64"], tiny_host)
    assert result.exit_code == 2
    assert "f64" in result.output
    assert invoke(["no-such-command"], tiny_host).exit_code == 2


def test_debug_keeps_the_traceback(tiny_host, tmp_path) -> None:
    args = ["build", str(tmp_path / "absent"), str(tmp_path / "out")]
    quiet = invoke(args, tiny_host)
    assert quiet.exit_code == 1 and isinstance(quiet.exception, SystemExit)
    for debug_args in (["--debug", *args], [*args, "--debug"]):
        loud = invoke(debug_args, tiny_host)
        assert loud.exit_code == 1
        assert isinstance(loud.exception, ConfigError)


def test_out_not_empty_is_refused_first(tiny_host, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    # the source does not even exist: OUT is checked before anything else
    result = invoke(["build", str(tmp_path / "absent"), str(out)], tiny_host)
    assert result.exit_code == 1
    assert "not a mobius package" in result.stderr and "--force" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"


def test_inspect_of_a_folder_that_is_no_package(tiny_host, tmp_path) -> None:
    result = invoke(["inspect", str(tmp_path)], tiny_host)
    assert result.exit_code == 1, result.output
    assert "error:" in result.stderr and "Traceback" not in result.output


def test_main_adds_plugin_commands_and_survives_broken_plugins(entry_points, capsys) -> None:
    entry_points(
        [
            ep("broken", "plugins_for_tests.broken_import"),
            ep("commands", "plugins_for_tests.commands"),
        ]
    )
    with pytest.raises(SystemExit) as info:
        main(["hello", "--name", "mobius"])
    assert info.value.code == 0
    assert capsys.readouterr().out == "hello mobius\n"
    with pytest.raises(SystemExit) as info:
        main(["plugins", "--json"])
    assert info.value.code == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["broken"]["status"] == "failed" and rows["commands"]["status"] == "ok"


# --------------------------------------------------------------------------- real processes


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "MOBIUS_PLUGINS"}
    environ.update(env)
    return subprocess.run(args, capture_output=True, text=True, env=environ, timeout=120)


def test_console_script_plugins_json() -> None:
    if not MOBIUS.exists():
        pytest.skip(f"no console script at {MOBIUS}")
    proc = run([str(MOBIUS), "plugins", "--json"])
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows and all(list(row) == KEYS for row in rows)
    by_name = {row["name"]: row for row in rows}
    assert by_name["mobius.checkpoint"]["status"] == "ok", by_name["mobius.checkpoint"]
    # every mobius plugin installed in this environment is listed, loaded and versioned
    for point in entry_points(group="mobius"):
        row = by_name[point.name]
        assert row["status"] == "ok", row
        assert row["distribution"] == point.dist.name and row["version"] == point.dist.version, row


def test_console_script_error_is_short(tmp_path) -> None:
    if not MOBIUS.exists():
        pytest.skip(f"no console script at {MOBIUS}")
    out = tmp_path / "out"
    (tmp_path / "src").mkdir()
    proc = run([str(MOBIUS), "build", str(tmp_path / "src"), str(out)], MOBIUS_PLUGINS="")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: no config.json"), proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


CHECK_IMPORTS = """
import sys
from mobius.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print([m for m in {heavy!r} if m in sys.modules])
"""


@pytest.mark.parametrize("plugins", ["", None], ids=["core-only", "all-installed"])
@pytest.mark.parametrize("args", [["--help"], ["plugins", "--json"]])
def test_help_imports_nothing_heavy(plugins, args) -> None:
    env = {} if plugins is None else {"MOBIUS_PLUGINS": plugins}
    code = CHECK_IMPORTS.format(heavy=HEAVY)
    proc = run([sys.executable, "-c", code, *args], **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-500:]


def test_import_mobius_cli_is_light() -> None:
    code = "import sys, mobius.cli; print(sorted(m for m in ('rich', 'numpy', *{heavy!r}) if m in sys.modules))"
    proc = run([sys.executable, "-c", code.format(heavy=HEAVY)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
