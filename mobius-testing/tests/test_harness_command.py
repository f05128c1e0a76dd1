"""``mobius harness``: mobius-testing's command, added through ``mobius_add_commands``."""

from __future__ import annotations

from typer.testing import CliRunner

from mobius.cli import make_app
from mobius.plugins import PluginHost


def test_testing_plugin_adds_harness_command() -> None:
    from mobius_testing import plugin

    host = PluginHost.from_plugins({"testing": plugin}, builtins=False)
    app = make_app()
    host.add_commands(app)
    result = CliRunner().invoke(app, ["harness"], obj={"host": host})
    assert result.exit_code == 0, result.output
    for level in ("L1", "L2", "L3", "L4", "L5"):
        assert f"  {level} " in result.stdout
    assert "[reference] extra:" in result.stdout


def test_testing_plugin_detects_reference_without_importing(monkeypatch) -> None:
    from mobius_testing import plugin

    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: None)
    report = plugin.harness_report()
    assert "[reference] extra: missing (torch missing, transformers missing)" in report
    assert "pip install 'mobius-testing[reference]'" in report
