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


@pytest.mark.parametrize(
    ("command", "distribution"),
    [("run", "mobius-runtime"), ("chat", "mobius-runtime"), ("golden", "mobius-testing")],
)
def test_a_command_of_a_missing_distribution_names_it(
    entry_points, capsys, monkeypatch, command: str, distribution: str
) -> None:
    """Was: "No such command 'run'" with no hint of what to install."""
    monkeypatch.delenv("MOBIUS_PLUGINS", raising=False)
    entry_points([ep("tinytest", "plugins_for_tests.tinytest")])
    with pytest.raises(SystemExit) as info:
        main([command, "pkg"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"error: no command {command!r}: it comes with {distribution}, which is not installed"
        in err
    )
    assert f"fix: pip install ./{distribution} (from a clone of the mobius repository" in err
    # installed but broken: says so instead of "not installed"
    entry_points([ep("runtime", "plugins_for_tests.broken_import", dist=distribution)])
    with pytest.raises(SystemExit) as info:
        main([command, "pkg"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"it comes with {distribution}, whose plugin 'runtime' is installed but failed" in err
    # an unknown command of nobody's keeps click's usage error
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2 and "No such command 'frobnicate'" in capsys.readouterr().err


def test_install_hints_know_every_family_model_type() -> None:
    """The model_type -> distribution table of the hints matches the installed families."""
    from mobius.plugin_env import REPOSITORY_MODEL_TYPES

    host = PluginHost.load()
    declared = {
        mt: record.distribution
        for record in host.records()
        if record.distribution in ("mobius-gemma4", "mobius-qwen3")
        for mt in record.model_types
    }
    if not declared:
        pytest.skip("no family plugin of this repository is installed")
    assert {mt: d for mt, d in REPOSITORY_MODEL_TYPES.items() if d in declared.values()} == declared


def test_no_plugin_for_the_model_type_names_the_family(tiny_host) -> None:
    with pytest.raises(ConfigError) as info:
        tiny_host.owner("qwen3")
    assert "install the mobius-qwen3 plugin: pip install ./mobius-qwen3 (from a clone" in str(
        info.value
    )
    with pytest.raises(ConfigError) as info:
        tiny_host.owner("llama")
    assert "model_type 'llama'" in info.value.fix and "pip install ./mobius-<family>" in (
        info.value.fix
    )


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


def test_inspect_says_a_tied_table_is_counted_under_both_ops(capsys) -> None:
    """Was "53 tensors quantized (2 GatherBlockQuantized, 52 MatMulNBits)" without a word."""
    from mobius.cli.cmd_inspect import _print_quantization

    tensors = {
        "embed": {"ops": ["GatherBlockQuantized", "MatMulNBits"], "bits": 4},
        "q": {"ops": ["MatMulNBits"], "bits": 4},
    }
    _print_quantization({"format": "int4", "components": {"model": {"tensors": tensors}}})
    out = capsys.readouterr().out
    assert (
        "model: 2 tensors quantized (1 GatherBlockQuantized int4, 2 MatMulNBits int4; "
        "read by several ops, counted under each, stored once: embed)" in out
    )
    del tensors["embed"]
    _print_quantization({"format": "int4", "components": {"model": {"tensors": tensors}}})
    assert "(1 MatMulNBits int4); " in capsys.readouterr().out
