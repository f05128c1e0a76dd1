"""PluginHost: loading, isolation, compatibility, allow-list, registry, owner-only calls."""

from __future__ import annotations

import pytest
from conftest import FakeDist, FakeEntryPoint, ep

import mobius.plugins
from mobius import hookimpl
from mobius.errors import ConfigError, PluginError
from mobius.plugins import PluginHost, PluginRecord, incompatibility
from mobius.records import ModelTypeInfo


def by_name(host: PluginHost) -> dict[str, PluginRecord]:
    return {r.name: r for r in host.records()}


def test_entry_point_plugin_loads_and_owns_its_model_type(tiny_host: PluginHost) -> None:
    record = by_name(tiny_host)["tinytest"]
    assert record == PluginRecord("tinytest", "mobius-tinytest", "0.1.0", ("tinytest",), "ok", "")
    assert tiny_host.owner("tinytest") == "tinytest"
    assert tiny_host.model_type_info("tinytest").tasks == ("feature-extraction",)


def test_builtin_checkpoint_plugin_is_registered(tiny_host: PluginHost) -> None:
    record = by_name(tiny_host)["mobius.checkpoint"]
    assert record.distribution == "mobius-core"
    assert record.status == "ok", record.reason


def test_plugin_raising_at_import_is_failed_and_others_keep_working(entry_points) -> None:
    entry_points(
        [
            ep("broken", "plugins_for_tests.broken_import"),
            ep("tinytest", "plugins_for_tests.tinytest"),
        ]
    )
    host = PluginHost.load()
    records = by_name(host)
    assert records["broken"].status == "failed"
    assert "tiny plugin exploded at import" in records["broken"].reason
    assert "RuntimeError" in records["broken"].reason
    assert records["tinytest"].status == "ok"
    assert host.owner("tinytest") == "tinytest"


def test_incompatible_plugin_is_skipped_without_import(entry_points) -> None:
    # The module would raise at import: status incompatible proves it was never imported.
    entry_points(
        [ep("future", "plugins_for_tests.broken_import", requires=["numpy", "mobius-core>=9.0"])]
    )
    record = by_name(PluginHost.load())["future"]
    assert record.status == "incompatible"
    assert "mobius-core>=9.0" in record.reason
    assert mobius.plugins.core_version() in record.reason
    assert "pip install" in record.reason


def test_incompatibility_reads_requires_dist() -> None:
    assert incompatibility("p", ["mobius-core>=0.1,<0.2"], "0.1.0") is None
    assert incompatibility("p", ["mobius-core<0.1"], "0.1.0") is not None
    assert incompatibility("p", ["Mobius_Core>=2"], "0.1.0") is not None  # names normalize
    # a requirement behind an extra does not bind the plugin
    assert incompatibility("p", ["mobius-core>=9; extra == 'dev'"], "0.1.0") is None
    assert incompatibility("p", ["not a requirement ((", "numpy"], "0.1.0") is None


def test_misspelled_hook_fails_that_plugin_only(entry_points) -> None:
    entry_points(
        [ep("typo", "plugins_for_tests.misspelled"), ep("tinytest", "plugins_for_tests.tinytest")]
    )
    host = PluginHost.load()
    records = by_name(host)
    assert records["typo"].status == "failed"
    assert "mobius_model_type" in records["typo"].reason
    assert "misspelled" in records["typo"].reason
    assert "typo" not in host.plugin_names()
    host.pm.check_pending()  # what remains is valid
    assert records["tinytest"].status == "ok"


def test_hookimpl_with_an_unknown_argument_is_failed(entry_points) -> None:
    class Bad:
        @hookimpl
        def mobius_model_types(self, nonsense):
            return []

    entry_points([ep("bad", Bad())])
    record = by_name(PluginHost.load())["bad"]
    assert record.status == "failed"
    assert "nonsense" in record.reason


def test_model_types_hook_raising_is_failed(entry_points) -> None:
    class Raises:
        @hookimpl
        def mobius_model_types(self):
            raise ValueError("no types today")

    entry_points([ep("raises", Raises())])
    host = PluginHost.load()
    assert "no types today" in by_name(host)["raises"].reason
    assert "raises" not in host.plugin_names()


@pytest.mark.parametrize(
    ("allow", "expected"),
    [("tinytest", {"tinytest"}), (" tinytest , commands ", {"tinytest", "commands"}), ("", set())],
)
def test_mobius_plugins_allow_list(entry_points, monkeypatch, allow, expected) -> None:
    entry_points(
        [
            ep("tinytest", "plugins_for_tests.tinytest"),
            ep("commands", "plugins_for_tests.commands"),
            ep("broken", "plugins_for_tests.broken_import"),
        ]
    )
    monkeypatch.setenv("MOBIUS_PLUGINS", allow)
    names = {r.name for r in PluginHost.load().records()} - {"mobius.checkpoint"}
    assert names == expected


def test_two_plugins_claiming_one_model_type(entry_points) -> None:
    entry_points(
        [
            ep("tinytest", "plugins_for_tests.tinytest", dist="mobius-tinytest"),
            ep("clone", "plugins_for_tests.tinytest_clone", dist="tinytest-clone", version="2.0"),
        ]
    )
    host = PluginHost.load()
    records = by_name(host)
    # both listed, both marked
    assert records["tinytest"].status == records["clone"].status == "ok"
    assert "tinytest-clone" in records["tinytest"].reason
    assert "mobius-tinytest" in records["clone"].reason
    with pytest.raises(PluginError) as info:
        host.owner("tinytest")
    assert "mobius-tinytest" in str(info.value) and "tinytest-clone" in str(info.value)
    with pytest.raises(PluginError):
        host.read_config("tinytest", {})
    # the unclaimed type of the clone still works
    assert host.owner("clone_only") == "clone"


def test_unknown_model_type_lists_what_is_served(tiny_host: PluginHost) -> None:
    with pytest.raises(ConfigError) as info:
        tiny_host.owner("llama")
    text = str(info.value)
    assert "'llama'" in text and "tinytest (mobius-tinytest): tinytest" in text
    assert info.value.fix


class Recorder:
    """A second plugin implementing owner-only hooks: it must never be called for tinytest."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @hookimpl
    def mobius_model_types(self):
        return [ModelTypeInfo("recorded")]

    @hookimpl
    def mobius_read_config(self, model_type, raw):
        self.calls.append(model_type)
        return "recorded-config"


def test_owner_only_calls_reach_only_the_owner(tiny_host: PluginHost) -> None:
    recorder = Recorder()
    host = PluginHost.from_plugins({"recorder": recorder}, load_entry_points=True)
    config = host.read_config("tinytest", {"in_features": 2, "out_features": 5})
    assert (config.in_features, config.out_features) == (2, 5)
    assert recorder.calls == []
    assert host.read_config("recorded", {}) == "recorded-config"
    assert recorder.calls == ["recorded"]


def test_owner_missing_a_hook_is_a_plugin_error(tiny_host: PluginHost) -> None:
    host = PluginHost.from_plugins({"recorder": Recorder()})
    with pytest.raises(PluginError, match="does not implement mobius_pipeline_contract"):
        host.pipeline_contract("recorded", None, None)
    assert host.runtime_files("recorded", None, None, None, None) == []


def test_exception_in_plugin_code_names_plugin_and_hook() -> None:
    class Buggy:
        @hookimpl
        def mobius_model_types(self):
            return [ModelTypeInfo("buggy")]

        @hookimpl
        def mobius_read_config(self, raw):
            return raw["absent"]

    host = PluginHost.from_plugins(
        {"buggy": Buggy()}, distributions={"buggy": ("buggy-dist", "1.2")}
    )
    with pytest.raises(PluginError) as info:
        host.read_config("buggy", {})
    err = info.value
    assert "buggy" in err.what and "mobius_read_config" in err.what and "KeyError" in err.what
    assert "buggy-dist 1.2" in err.what
    assert isinstance(err.__cause__, KeyError)


def test_mobius_error_from_plugin_passes_through_with_plugin_as_where(tiny_host) -> None:
    with pytest.raises(ConfigError) as info:
        tiny_host.read_config("tinytest", {"in_features": 3})
    assert info.value.what == "config.json lacks out_features"
    assert info.value.where == "plugin tinytest (mobius_read_config)"
    assert "plugin tinytest" in str(info.value)


class Opener:
    def __init__(self, answer):
        self.answer = answer
        self.seen = []

    @hookimpl
    def mobius_open_checkpoint(self, source, revision):
        self.seen.append((source, revision))
        return self.answer


def test_external_open_checkpoint_runs_before_builtins(tiny_checkpoint) -> None:
    # builtins registered first -> called last (pluggy is LIFO): an external answer wins
    # even for an existing local folder.
    marker = object()
    host = PluginHost.from_plugins({"opener": Opener(marker)})
    assert host.open_checkpoint(str(tiny_checkpoint), None) is marker
    # pluggy's own call agrees with the host's order
    assert (
        host.pm.hook.mobius_open_checkpoint(
            source=str(tiny_checkpoint), revision=None, host=host, companion=None
        )
        is marker
    )


def test_builtins_answer_when_no_external_plugin_does(tiny_checkpoint) -> None:
    opener = Opener(None)
    host = PluginHost.from_plugins({"opener": opener})
    checkpoint = host.open_checkpoint(str(tiny_checkpoint), None)
    assert opener.seen == [(str(tiny_checkpoint), None)]
    assert checkpoint is not None and checkpoint.raw_config["model_type"] == "tinytest"
    assert host.open_checkpoint("/no/such/folder/at/all", None) is None


def test_optimize_component_chains_plugins_in_registration_order() -> None:
    order = []

    def optimizer(tag, result):
        class Opt:
            @hookimpl
            def mobius_optimize_component(self, model, component, target):
                order.append(tag)
                return None if result is None else [*model, tag]

        return Opt()

    host = PluginHost.from_plugins(
        {"a": optimizer("a", True), "b": optimizer("b", None), "c": optimizer("c", True)},
        builtins=False,
    )
    assert host.optimize_component([], "decoder", "cpu") == ["a", "c"]
    assert order == ["a", "b", "c"]


def test_add_commands_failure_marks_plugin_failed() -> None:
    import typer

    class BadCommands:
        @hookimpl
        def mobius_add_commands(self, app):
            raise RuntimeError("no commands")

    host = PluginHost.from_plugins({"bad": BadCommands()}, builtins=False)
    failed = host.add_commands(typer.Typer())
    assert [r.name for r in failed] == ["bad"]
    assert by_name(host)["bad"].status == "failed"
    assert "no commands" in by_name(host)["bad"].reason


def test_duplicate_entry_point_name_is_failed_not_fatal(entry_points) -> None:
    entry_points(
        [
            ep("tinytest", "plugins_for_tests.tinytest"),
            FakeEntryPoint("tinytest", "plugins_for_tests.commands", FakeDist("other")),
        ]
    )
    records = PluginHost.load().records()
    statuses = [(r.name, r.distribution, r.status) for r in records if r.name == "tinytest"]
    assert statuses == [("tinytest", "mobius-tinytest", "ok"), ("tinytest", "other", "failed")]


def test_record_to_dict_has_exactly_the_cli_keys() -> None:
    record = PluginRecord("n", "d", "1", ("a",), "ok", "")
    assert list(record.to_dict()) == [
        "name",
        "distribution",
        "version",
        "model_types",
        "status",
        "reason",
    ]
