"""Installing Qwen3 beside (or without) Gemma 4: discovery through entry points.

A throwaway venv per case is too slow for CI, so these tests use what a user's install
changes for core: the entry points of group ``mobius`` that are present. The
``MOBIUS_PLUGINS`` allow-list narrows them exactly as an uninstall would, and core's
plugin host then sees only what is left (the real install / uninstall was done by hand;
see the README).
"""

from __future__ import annotations

import pytest
from conftest import TESTDATA

from mobius.errors import ConfigError
from mobius.plugins import PluginHost
from mobius_testing.lm_parity import plugins_listed

FAMILIES = {"gemma4", "qwen3"}


def test_qwen3_entry_point_is_installed():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="mobius")}
    assert eps.get("qwen3") == "mobius_qwen3.plugin:FAMILY"


def test_only_qwen3_lists_only_qwen3(monkeypatch):
    rows = plugins_listed(monkeypatch, "qwen3,runtime")
    assert FAMILIES & set(rows) == {"qwen3"}
    assert rows["qwen3"]["status"] == "ok"
    assert rows["qwen3"]["distribution"] == "mobius-qwen3"
    assert set(rows["qwen3"]["model_types"]) == {"qwen3", "qwen3_moe"}


def test_both_familiesplugins_listed(monkeypatch):
    pytest.importorskip("mobius_gemma4")
    rows = plugins_listed(monkeypatch, None)
    assert set(rows) >= FAMILIES
    assert all(rows[f]["status"] == "ok" for f in FAMILIES)


def test_without_gemma4_qwen3_still_builds(monkeypatch, tmp_path):
    """The Qwen3 build needs no other family; a Gemma 4 checkpoint then gets a clear error."""
    import mobius

    monkeypatch.setenv("MOBIUS_PLUGINS", "qwen3")
    host = PluginHost.load()
    assert host.owner("qwen3") and host.owner("qwen3_moe")
    with pytest.raises(ConfigError) as err:
        host.owner("gemma4_text")
    assert err.value.fix
    result = mobius.build(str(TESTDATA / "tiny-qwen3"), str(tmp_path / "pkg"), host=host)
    assert set(result.components) == {"model"}


def test_without_qwen3_gemma4_still_builds(monkeypatch):
    pytest.importorskip("mobius_gemma4")
    monkeypatch.setenv("MOBIUS_PLUGINS", "gemma4")
    host = PluginHost.load()
    assert host.owner("gemma4_text")
    with pytest.raises(ConfigError):
        host.owner("qwen3")
