"""A plugin hook that raises during a build: the error names the plugin and the hook,
nothing is written, and the same process builds again afterwards.

Each build-time hook is made to fail in turn: the owner's per-model hooks
(config, contract, component graph, weight plan, runtime files) and the
broadcast hooks any plugin may implement (optimizer, checkpoint opener).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import write_tiny_checkpoint
from plugins_for_tests import tinytest
from typer.testing import CliRunner

import mobius
from mobius import hookimpl
from mobius.cli import make_app
from mobius.errors import ConfigError, PluginError
from mobius.package import verify_package
from mobius.plugins import PluginHost

OWNER_HOOKS = (
    "mobius_read_config",
    "mobius_pipeline_contract",
    "mobius_build_component",
    "mobius_weight_plan",
    "mobius_runtime_files",
)


class Boom(RuntimeError):
    """What the faulty hooks raise (a plugin bug, not a MobiusError)."""


class Owner:
    """The tinytest family; ``failing`` names hooks that raise (``times`` times each)."""

    def __init__(self, *failing: str, times: int | None = None, error: type = Boom) -> None:
        self.failing = set(failing)
        self.left = times
        self.error = error

    def _call(self, hook: str, *args: Any) -> Any:
        if hook in self.failing and (self.left is None or self.left > 0):
            if self.left is not None:
                self.left -= 1
            raise self.error(f"{hook} went wrong")
        return getattr(tinytest, hook)(*args)

    @hookimpl
    def mobius_model_types(self) -> Any:
        return tinytest.mobius_model_types()

    @hookimpl
    def mobius_read_config(self, model_type: str, raw: dict[str, Any]) -> Any:
        return self._call("mobius_read_config", model_type, raw)

    @hookimpl
    def mobius_pipeline_contract(self, config: Any, options: Any) -> Any:
        return self._call("mobius_pipeline_contract", config, options)

    @hookimpl
    def mobius_build_component(self, config: Any, component: str, options: Any) -> Any:
        return self._call("mobius_build_component", config, component, options)

    @hookimpl
    def mobius_weight_plan(self, config: Any, component: str, checkpoint: Any, options: Any) -> Any:
        return self._call("mobius_weight_plan", config, component, checkpoint, options)

    @hookimpl
    def mobius_runtime_files(self, config: Any) -> Any:
        return self._call("mobius_runtime_files", config)


class Optimizer:
    """A plugin that owns no model type and only rewrites graphs — and crashes doing it."""

    @hookimpl
    def mobius_optimize_component(self, model: Any, component: str, target: str) -> Any:
        raise Boom("optimizer went wrong")


class Opener:
    """A plugin that claims every checkpoint source first — and crashes opening it."""

    @hookimpl
    def mobius_open_checkpoint(self, source: str, revision: str | None) -> Any:
        raise Boom("opener went wrong")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    # 2 KiB weight: external data, so a build really writes a data file
    return write_tiny_checkpoint(tmp_path / "ckpt", in_features=16, out_features=32)


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.lstrip(".").startswith(out.name))


def assert_plugin_error(exc: PluginError, plugin: str, hook: str, out: Path) -> None:
    assert f"plugin {plugin} raised in {hook}: Boom:" in exc.what, exc.what
    assert exc.where == f"plugin {plugin}, hook {hook}"
    assert exc.fix and "--debug" in exc.fix
    assert isinstance(exc.__cause__, Boom)
    assert leftovers(out) == []


def build(host: PluginHost, source: Path, out: Path) -> Any:
    return mobius.build(str(source), str(out), host=host)


def good_build_works(host: PluginHost, source: Path, out: Path) -> None:
    result = build(host, source, out)
    assert result.out == out.absolute() and result.n_tensors == 1
    assert verify_package(out) == []
    assert leftovers(out) == [out.name]


@pytest.mark.parametrize("hook", OWNER_HOOKS)
def test_owner_hook_raising_is_named_and_the_next_build_works(
    checkpoint: Path, tmp_path: Path, hook: str
) -> None:
    faulty = PluginHost.from_plugins({"faulty": Owner(hook)})
    out = tmp_path / "out"
    with pytest.raises(PluginError) as info:
        build(faulty, checkpoint, out)
    assert_plugin_error(info.value, "faulty", hook, out)

    # a good host in the same process, to the same OUT
    good_build_works(PluginHost.from_plugins({"tinytest": tinytest}), checkpoint, out)


@pytest.mark.parametrize(
    ("plugin", "hook"),
    [(Optimizer(), "mobius_optimize_component"), (Opener(), "mobius_open_checkpoint")],
    ids=["optimize", "open_checkpoint"],
)
def test_broadcast_hook_raising_names_the_bystander_plugin(
    checkpoint: Path, tmp_path: Path, plugin: object, hook: str
) -> None:
    host = PluginHost.from_plugins({"tinytest": tinytest, "meddler": plugin})
    out = tmp_path / "out"
    with pytest.raises(PluginError) as info:
        build(host, checkpoint, out)
    assert_plugin_error(info.value, "meddler", hook, out)
    good_build_works(PluginHost.from_plugins({"tinytest": tinytest}), checkpoint, out)


@pytest.mark.parametrize("hook", OWNER_HOOKS)
def test_same_host_builds_after_a_transient_failure(
    checkpoint: Path, tmp_path: Path, hook: str
) -> None:
    """Core keeps no half state between builds: the host that failed builds next time."""
    owner = Owner(hook, times=1)
    host = PluginHost.from_plugins({"flaky": owner})
    plugins_before = sorted(name for name, _ in host.pm.list_name_plugin())
    records_before = host.records()
    out = tmp_path / "out"
    with pytest.raises(PluginError):
        build(host, checkpoint, out)
    assert leftovers(out) == []
    assert sorted(name for name, _ in host.pm.list_name_plugin()) == plugins_before
    assert host.records() == records_before
    assert host.model_types() == {"tinytest": ["flaky"]}
    good_build_works(host, checkpoint, out)


def test_failure_after_graphs_were_bound_leaves_them_reusable(
    checkpoint: Path, tmp_path: Path
) -> None:
    """runtime_files fails after every graph was built and bound; the retry rebuilds cleanly."""
    host = PluginHost.from_plugins({"flaky": Owner("mobius_runtime_files", times=2)})
    out = tmp_path / "out"
    for _ in range(2):
        with pytest.raises(PluginError, match="mobius_runtime_files"):
            build(host, checkpoint, out)
        assert leftovers(out) == []
    good_build_works(host, checkpoint, out)


def test_mobius_error_from_a_hook_keeps_its_message_and_gains_a_where(
    checkpoint: Path, tmp_path: Path
) -> None:
    """A plugin's own MobiusError is passed on (not wrapped); `where` names plugin and hook."""
    host = PluginHost.from_plugins(
        {"picky": Owner("mobius_build_component", error=lambda text: ConfigError(text))}
    )
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as info:
        build(host, checkpoint, out)
    assert info.value.what == "mobius_build_component went wrong"
    assert info.value.where == "plugin picky (mobius_build_component)"
    assert leftovers(out) == []


def test_cli_prints_plugin_and_hook_without_traceback(checkpoint: Path, tmp_path: Path) -> None:
    host = PluginHost.from_plugins({"faulty": Owner("mobius_weight_plan")})
    out = tmp_path / "out"
    runner = CliRunner()
    failed = runner.invoke(make_app(), ["build", str(checkpoint), str(out)], obj={"host": host})
    assert failed.exit_code == 1
    assert "error: plugin faulty raised in mobius_weight_plan: Boom:" in failed.stderr
    assert "where: plugin faulty, hook mobius_weight_plan" in failed.stderr
    assert "Traceback" not in failed.output
    assert leftovers(out) == []

    good = PluginHost.from_plugins({"tinytest": tinytest})
    ok = runner.invoke(make_app(), ["build", str(checkpoint), str(out)], obj={"host": good})
    assert ok.exit_code == 0, ok.output
    assert verify_package(out) == []


class Returns(Owner):
    """tinytest, except that ``hook`` returns ``value`` instead of its answer."""

    def __init__(self, hook: str, value: Any) -> None:
        super().__init__()
        self.hook, self.value = hook, value

    def _call(self, hook: str, *args: Any) -> Any:
        return self.value if hook == self.hook else super()._call(hook, *args)


class BadOptimizer:
    @hookimpl
    def mobius_optimize_component(self, model: Any, component: str, target: str) -> Any:
        return "an optimized model, honest"


@pytest.mark.parametrize(
    ("hook", "value", "expected"),
    [
        ("mobius_read_config", None, "a config object"),
        ("mobius_pipeline_contract", None, "a mobius.contract.Contract"),
        ("mobius_pipeline_contract", {"components": []}, "a mobius.contract.Contract"),
        ("mobius_build_component", None, "an onnx_ir.Model"),
        ("mobius_weight_plan", {"w": "proj.weight"}, "a mobius.weights.WeightPlan"),
        ("mobius_runtime_files", "tinytest.txt", "a list of RuntimeFile"),
        ("mobius_runtime_files", [b"tiny\n"], "only RuntimeFile records in its list"),
    ],
)
def test_hook_returning_the_wrong_thing_is_named(
    checkpoint: Path, tmp_path: Path, hook: str, value: Any, expected: str
) -> None:
    """Not a crash deep in core (AttributeError blaming no one): the plugin and hook are named."""
    host = PluginHost.from_plugins({"sloppy": Returns(hook, value)})
    out = tmp_path / "out"
    with pytest.raises(PluginError) as info:
        build(host, checkpoint, out)
    returned = type(value[0] if isinstance(value, list) else value).__name__
    assert info.value.what == (
        f"plugin sloppy returned {returned} from {hook}, expected {expected}"
    )
    assert info.value.where == f"plugin sloppy, hook {hook}"
    assert leftovers(out) == []


def test_runtime_files_returning_none_means_no_files(checkpoint: Path, tmp_path: Path) -> None:
    host = PluginHost.from_plugins({"quiet": Returns("mobius_runtime_files", None)})
    out = tmp_path / "out"
    build(host, checkpoint, out)
    assert not (out / "tinytest.txt").exists()
    assert verify_package(out) == []


def test_optimizer_returning_the_wrong_thing_is_named(checkpoint: Path, tmp_path: Path) -> None:
    host = PluginHost.from_plugins({"tinytest": tinytest, "meddler": BadOptimizer()})
    out = tmp_path / "out"
    with pytest.raises(PluginError, match="plugin meddler returned str from mobius_optimize"):
        build(host, checkpoint, out)
    assert leftovers(out) == []
