"""Installing Llama beside (or without) the other families: discovery through entry points.

As in mobius-qwen3's discovery tests, the ``MOBIUS_PLUGINS`` allow-list narrows the
installed ``mobius`` entry points exactly as an uninstall would.
"""

from __future__ import annotations

import pytest

from mobius.errors import ConfigError
from mobius.plugins import PluginHost
from mobius_testing.lm_parity import plugins_listed


def test_llama_entry_point_is_installed():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="mobius")}
    assert eps.get("llama") == "mobius_llama.plugin:FAMILY"


def test_only_llama_lists_only_llama(monkeypatch):
    rows = plugins_listed(monkeypatch, "llama,runtime")
    families = {n for n, r in rows.items() if r["model_types"]}
    assert families == {"llama"}
    assert rows["llama"]["status"] == "ok" and rows["llama"]["distribution"] == "mobius-llama"
    assert set(rows["llama"]["model_types"]) == {"llama", "mistral"}


def test_every_installed_family_loads_beside_llama(monkeypatch):
    rows = plugins_listed(monkeypatch, None)
    families = {n for n, r in rows.items() if r["model_types"]}
    assert "llama" in families
    assert all(rows[f]["status"] == "ok" for f in families)
    owners = [t for f in families for t in rows[f]["model_types"]]
    assert len(owners) == len(set(owners))  # no model type claimed twice


def test_without_llama_its_types_are_a_clear_error(monkeypatch):
    monkeypatch.setenv("MOBIUS_PLUGINS", "runtime")
    host = PluginHost.load()
    with pytest.raises(ConfigError) as err:
        host.owner("llama")
    assert err.value.fix
