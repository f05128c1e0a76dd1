"""Installing Gemma 3 beside (or without) the other families: discovery through entry points.

As in mobius-qwen3's discovery tests, the ``MOBIUS_PLUGINS`` allow-list narrows the
installed ``mobius`` entry points exactly as an uninstall would.
"""

from __future__ import annotations

import pytest

from mobius.errors import ConfigError
from mobius.plugins import PluginHost
from mobius_testing.lm_parity import plugins_listed


def test_gemma3_entry_point_is_installed():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="mobius")}
    assert eps.get("gemma3") == "mobius_gemma3.plugin:FAMILY"


def test_only_gemma3_lists_only_gemma3(monkeypatch):
    rows = plugins_listed(monkeypatch, "gemma3,runtime")
    families = {n for n, r in rows.items() if r["model_types"]}
    assert families == {"gemma3"}
    assert rows["gemma3"]["status"] == "ok" and rows["gemma3"]["distribution"] == "mobius-gemma3"
    assert set(rows["gemma3"]["model_types"]) == {"gemma3_text"}


def test_every_installed_family_loads_beside_gemma3(monkeypatch):
    rows = plugins_listed(monkeypatch, None)
    families = {n for n, r in rows.items() if r["model_types"]}
    assert "gemma3" in families
    assert all(rows[f]["status"] == "ok" for f in families)
    owners = [t for f in families for t in rows[f]["model_types"]]
    assert len(owners) == len(set(owners))  # no model type claimed twice


def test_without_gemma3_its_types_are_a_clear_error(monkeypatch):
    monkeypatch.setenv("MOBIUS_PLUGINS", "runtime")
    host = PluginHost.load()
    with pytest.raises(ConfigError) as err:
        host.owner("gemma3_text")
    assert err.value.fix
