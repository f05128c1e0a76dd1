"""Failure isolation holds for every exception class a plugin can throw, hooks go
through pluggy's callers (tracing and wrappers work), and ``MOBIUS_PLUGINS`` hiding a
command says so.

- at import: ``sys.exit()``, ``KeyboardInterrupt`` raised by the plugin itself, a
  ``BaseException`` subclass: the plugin is ``failed``, the CLI answers;
- in a hook (model types, owner hooks, commands, openers): the same exceptions
  become a PluginError naming plugin and hook, or a ``failed`` record;
- a real SIGINT while a hook runs still interrupts (it is not the plugin's doing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ep, write_tiny_checkpoint
from plugins_for_tests import tinytest

import mobius
from mobius import hookimpl
from mobius.cli import main
from mobius.errors import PluginError
from mobius.plugins import PluginHost


class PluginAbort(BaseException):
    """A BaseException subclass a plugin might raise."""


THROWN = {
    "sys.exit": (lambda: sys.exit(3), "SystemExit: 3"),
    "KeyboardInterrupt": (
        lambda: _raise(KeyboardInterrupt("by the plugin")),
        "KeyboardInterrupt: by the plugin",
    ),
    "BaseException": (lambda: _raise(PluginAbort("aborted")), "PluginAbort: aborted"),
}


def _raise(exc: BaseException) -> Any:
    raise exc


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        ("plugins_for_tests.exits_at_import", "SystemExit: 3"),
        ("plugins_for_tests.interrupts_at_import", "KeyboardInterrupt: plugin raised"),
        ("plugins_for_tests.base_exception_at_import", "PluginAbort: plugin aborted"),
    ],
)
def test_a_plugin_that_throws_anything_at_import_is_failed_and_the_cli_answers(
    entry_points, capsys, module: str, reason: str
) -> None:
    entry_points([ep("rogue", module), ep("tinytest", "plugins_for_tests.tinytest")])
    with pytest.raises(SystemExit) as info:
        main(["plugins", "--json"])
    assert info.value.code in (0, None)
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["rogue"]["status"] == "failed"
    assert rows["rogue"]["reason"].startswith("import failed: " + reason), rows["rogue"]
    assert rows["tinytest"]["status"] == "ok"


@pytest.mark.parametrize("kind", list(THROWN))
def test_model_types_hook_throwing_anything_fails_only_that_plugin(kind: str) -> None:
    throw, text = THROWN[kind]

    class Rogue:
        @hookimpl
        def mobius_model_types(self) -> Any:
            throw()

    host = PluginHost.from_plugins({"rogue": Rogue(), "tinytest": tinytest})
    records = {r.name: r for r in host.records()}
    assert records["rogue"].status == "failed"
    assert records["rogue"].reason == f"mobius_model_types raised {text}"
    assert records["tinytest"].status == "ok"


@pytest.mark.parametrize("kind", list(THROWN))
def test_an_owner_hook_throwing_anything_is_a_plugin_error(tmp_path: Path, kind: str) -> None:
    throw, text = THROWN[kind]

    class Owner:
        mobius_model_types = staticmethod(hookimpl(tinytest.mobius_model_types))
        mobius_read_config = staticmethod(hookimpl(tinytest.mobius_read_config))

        @hookimpl
        def mobius_pipeline_contract(self, config: Any, options: Any) -> Any:
            throw()

    source = write_tiny_checkpoint(tmp_path / "ckpt")
    host = PluginHost.from_plugins({"owner": Owner()})
    with pytest.raises(PluginError) as info:
        mobius.build(str(source), str(tmp_path / "out"), host=host)
    assert f"plugin owner raised in mobius_pipeline_contract: {text}" in info.value.what
    assert info.value.where == "plugin owner, hook mobius_pipeline_contract"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", list(THROWN))
def test_add_commands_throwing_anything_marks_the_plugin_failed(
    entry_points, capsys, kind: str
) -> None:
    throw, text = THROWN[kind]

    class Commands:
        @hookimpl
        def mobius_add_commands(self, app: Any) -> None:
            throw()

    entry_points([ep("rogue", Commands()), ep("tinytest", "plugins_for_tests.tinytest")])
    with pytest.raises(SystemExit) as info:
        main(["plugins", "--json"])
    assert info.value.code in (0, None)
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["rogue"]["status"] == "failed"
    assert rows["rogue"]["reason"] == f"mobius_add_commands raised {text}"


def test_an_opener_that_raises_is_no_longer_listed_ok(tmp_path: Path) -> None:
    class Opener:
        @hookimpl
        def mobius_open_checkpoint(self, source: str, revision: Any) -> Any:
            raise RuntimeError("opener went wrong")

    host = PluginHost.from_plugins({"tinytest": tinytest, "opener": Opener()})
    assert {r.name: r.status for r in host.records()}["opener"] == "ok"
    source = write_tiny_checkpoint(tmp_path / "ckpt")
    with pytest.raises(PluginError, match="plugin opener raised in mobius_open_checkpoint"):
        mobius.build(str(source), str(tmp_path / "out"), host=host)
    record = {r.name: r for r in host.records()}["opener"]
    assert record.status == "failed"
    assert "raised in mobius_open_checkpoint: RuntimeError: opener went wrong" in record.reason


def test_a_real_ctrl_c_during_a_hook_still_interrupts(tmp_path: Path) -> None:
    """The signal arrives while the hook sleeps: KeyboardInterrupt, not a PluginError."""

    class Slow:
        mobius_model_types = staticmethod(hookimpl(tinytest.mobius_model_types))

        @hookimpl
        def mobius_read_config(self, model_type: str, raw: Any) -> Any:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            raise AssertionError("the signal did not arrive")

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        source = write_tiny_checkpoint(tmp_path / "ckpt")
        host = PluginHost.from_plugins({"slow": Slow()})
        with pytest.raises(KeyboardInterrupt):
            mobius.build(str(source), str(tmp_path / "out"), host=host)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signal.getsignal(signal.SIGINT) is previous


# --------------------------------------------------------------------------- pluggy machinery


def test_owner_hooks_go_through_pluggy_tracing_and_wrappers(tmp_path: Path) -> None:
    seen: list[str] = []
    wrapped: list[str] = []

    class Wrapper:
        """Wraps every graph build (as a profiling plugin would); owns nothing."""

        @hookimpl(wrapper=True)
        def mobius_build_component(self, config: Any, component: str, options: Any) -> Any:
            model = yield
            wrapped.append(component)
            return model

    class Bystander:
        """Implements an owner hook for a model type it does not own: never called."""

        @hookimpl
        def mobius_build_component(self, config: Any, component: str, options: Any) -> Any:
            raise AssertionError("a non-owner's implementation was called")

    host = PluginHost.from_plugins(
        {"tinytest": tinytest, "wrapper": Wrapper(), "bystander": Bystander()}
    )
    undo = host.pm.add_hookcall_monitoring(
        lambda hook_name, impls, kwargs: seen.append(hook_name), lambda *a: None
    )
    try:
        source = write_tiny_checkpoint(tmp_path / "ckpt")
        mobius.build(str(source), str(tmp_path / "out"), host=host)
    finally:
        undo()
    assert wrapped == ["model"]
    for hook in ("mobius_read_config", "mobius_pipeline_contract", "mobius_build_component"):
        assert hook in seen, seen
    assert "mobius_weight_plan" in seen and "mobius_open_checkpoint" in seen


# --------------------------------------------------------------------------- the allow-list


def test_a_command_hidden_by_the_allow_list_says_so(entry_points, capsys, monkeypatch) -> None:
    entry_points(
        [ep("tinytest", "plugins_for_tests.tinytest"), ep("cmds", "plugins_for_tests.commands")]
    )
    monkeypatch.setenv("MOBIUS_PLUGINS", "tinytest")
    with pytest.raises(SystemExit) as info:
        main(["hello"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: no command 'hello'; MOBIUS_PLUGINS='tinytest'" in err
    assert "cmds" in err and "unset MOBIUS_PLUGINS" in err
    monkeypatch.delenv("MOBIUS_PLUGINS")
    with pytest.raises(SystemExit) as info:
        main(["hello"])
    assert info.value.code in (0, None)
    assert "hello world" in capsys.readouterr().out


def test_the_real_runtime_hidden_by_the_allow_list() -> None:
    """``MOBIUS_PLUGINS=gemma4 mobius run``, as the issue found it (when installed)."""
    pytest.importorskip("mobius_runtime")
    from importlib.metadata import entry_points

    if "runtime" not in {e.name for e in entry_points(group="mobius")}:
        pytest.skip("mobius-runtime is not installed as a distribution here")
    env = {**os.environ, "MOBIUS_PLUGINS": "gemma4"}
    code = "import sys; from mobius.cli import main; main(sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, "run", "pkg"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2
    assert "no command 'run'" in proc.stderr and "runtime" in proc.stderr
