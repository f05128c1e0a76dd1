"""A plugin whose ``mobius-core`` requirement excludes the installed core is refused at load.

The plugin's distribution metadata is faked (conftest's FakeDist), so the real
entry-point loading path runs: Requires-Dist is read, the plugin is recorded
``incompatible`` and its module is never imported, and the reason names the
plugin's version, the range it needs, the installed core and the pip command
that fixes it. A user who then asks for the plugin's model type is pointed at it.
"""

from __future__ import annotations

import pytest
from conftest import ep

import mobius
import mobius.plugins
from mobius.errors import ConfigError
from mobius.plugins import PluginHost, incompatibility

CORE = "0.1.0"


@pytest.fixture
def core_010(monkeypatch: pytest.MonkeyPatch) -> str:
    """Pretend the installed core is 0.1.0, whatever this checkout's version is."""
    monkeypatch.setattr(mobius.plugins, "core_version", lambda: CORE)
    return CORE


def load_one(entry_points, **dist_kw) -> mobius.plugins.PluginRecord:
    # broken_import raises when imported: an `incompatible` record proves it never was
    entry_points([ep("future", "plugins_for_tests.broken_import", "mobius-future", **dist_kw)])
    host = PluginHost.load()
    assert "future" not in host.plugin_names()
    (record,) = [r for r in host.records() if r.name == "future"]
    return record


def test_plugin_needing_a_newer_core_is_refused_with_both_versions_and_the_fix(
    entry_points, core_010
) -> None:
    record = load_one(entry_points, version="0.3.2", requires=["mobius-core>=0.3,<0.4"])
    assert record.status == "incompatible"
    assert (record.distribution, record.version) == ("mobius-future", "0.3.2")
    assert record.reason == (
        "mobius-future 0.3.2 requires mobius-core<0.4,>=0.3, but mobius-core 0.1.0 is "
        "installed; fix: pip install 'mobius-core<0.4,>=0.3' (replaces mobius-core 0.1.0)"
    )


def test_plugin_too_old_for_the_core_also_offers_upgrading_the_plugin(
    entry_points, core_010
) -> None:
    record = load_one(entry_points, version="0.0.9", requires=["numpy", "mobius-core<0.1"])
    assert record.status == "incompatible"
    assert "mobius-future 0.0.9 requires mobius-core<0.1" in record.reason
    assert "mobius-core 0.1.0 is installed" in record.reason
    assert "pip install 'mobius-core<0.1'" in record.reason
    assert record.reason.endswith("pip install -U mobius-future")


def test_the_real_core_version_is_what_gets_compared(entry_points) -> None:
    # no monkeypatch: the installed core's own metadata decides
    record = load_one(entry_points, requires=["mobius-core>=999"])
    assert record.status == "incompatible"
    assert f"mobius-core {mobius.plugins.core_version()} is installed" in record.reason


def test_a_compatible_range_loads(entry_points, core_010) -> None:
    entry_points([ep("tinytest", "plugins_for_tests.tinytest", requires=["mobius-core>=0.1,<0.2"])])
    record = {r.name: r for r in PluginHost.load().records()}["tinytest"]
    assert (record.status, record.reason) == ("ok", "")


def test_building_its_model_type_points_at_the_refused_plugin(entry_points, core_010) -> None:
    entry_points(
        [
            ep("future", "plugins_for_tests.broken_import", requires=["mobius-core>=0.3"]),
            ep("tinytest", "plugins_for_tests.tinytest"),
        ]
    )
    with pytest.raises(ConfigError) as info:
        PluginHost.load().owner("futuremodel")
    assert "future (incompatible)" in str(info.value)


@pytest.mark.parametrize(
    ("requires", "core", "refused"),
    [
        (["mobius-core>=0.1,<0.2"], "0.1.0", False),
        (["mobius-core>=0.1,<0.2"], "0.2.0", True),
        (["mobius-core>=0.2"], "0.1.5", True),
        (["mobius-core~=0.1.0"], "0.1.7", False),
        (["mobius-core==0.1.*"], "0.2.0", True),
        (["mobius-core>=0.2; python_version < '3'"], "0.1.0", False),  # marker is false here
        (["numpy>=1"], "0.1.0", False),  # no requirement on core at all
        (["mobius-core (<0.2,>=0.1)"], "0.2.0", True),  # the parenthesised metadata form
        (["Mobius_Core>=0.2"], "0.1.0", True),  # names compare normalised
        (["mobius-core[extra]>=0.2"], "0.1.0", True),  # extras: the full parser
        (['mobius-core>=0.2; extra == "dev"'], "0.1.0", False),  # only for an extra
        (["mobius-corex>=9"], "0.1.0", False),  # another distribution
    ],
)
def test_incompatibility_follows_the_declared_range(requires, core, refused) -> None:
    why = incompatibility("mobius-x", requires, core, "1.0")
    assert (why is not None) == refused
    if refused:
        assert why.startswith("mobius-x 1.0 requires mobius-core")
        assert f"mobius-core {core} is installed" in why


def test_hook_api_version_is_exported() -> None:
    major, minor = mobius.HOOK_API_VERSION.split(".")
    assert major.isdigit() and minor.isdigit()
