"""The plugin host: a typed facade over pluggy's PluginManager.

Why a facade: pluggy calls every implementation of a hook and returns a list,
which is right for broadcast hooks but wrong for per-model hooks, where exactly
one plugin (the owner of a ``model_type``) must answer. :class:`PluginHost` keeps
that rule in one place, and keeps the CLI alive when a plugin is broken:

- entry points of group ``mobius`` are loaded one at a time; a plugin that fails
  to import, registers a misspelled hook or raises while declaring its model
  types is recorded ``failed`` and skipped; one whose distribution requires a
  ``mobius-core`` range that excludes the installed core is recorded
  ``incompatible`` and never imported;
- ``MOBIUS_PLUGINS`` (comma list of entry-point names, empty = none) limits which
  external plugins load;
- core's built-in plugins (``mobius.checkpoint.builtin``) are registered *first*:
  pluggy calls implementations last-registered-first, so the built-ins answer
  ``mobius_open_checkpoint`` only when no external plugin did;
- owner-only calls reach the owning plugin's implementation alone (and every
  wrapper), through pluggy's hook callers; any exception a plugin raises, of any
  class, is a :class:`~mobius.errors.PluginError` naming the plugin and the hook
  (:mod:`mobius.plugin_calls`).

Where plugins come from and whether they fit the installed core is
:mod:`mobius.plugin_env`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pluggy

from mobius import hookspecs
from mobius.errors import ConfigError, MobiusError, PluginError
from mobius.plugin_calls import (
    call_plugin,
    check_answer,
    contained,
    describe,
    implementers,
    implements,
    spec_names,
    unknown_hooks,
)
from mobius.plugin_env import (
    CORE_DISTRIBUTION,
    ENTRY_POINT_GROUP,
    ENV_ALLOW_LIST,
    allow_list,
    core_version,
    family_install_hint,
    incompatibility,
    list_entry_points,
)
from mobius.plugin_env import _dist_of as _dist_of

if TYPE_CHECKING:
    import onnx_ir as ir
    import typer

    from mobius.checkpoint import Checkpoint
    from mobius.contract import Contract
    from mobius.records import (
        BuildOptions,
        GGUFTranslation,
        ModelTypeInfo,
        Processors,
        RuntimeFile,
    )
    from mobius.weights import WeightPlan

BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (("mobius.checkpoint", "mobius.checkpoint.builtin"),)
"""(plugin name, module) of the plugins core registers itself, before external ones."""

STATUSES = ("ok", "failed", "incompatible")


@dataclass(frozen=True)
class PluginRecord:
    """What ``mobius plugins`` shows for one plugin.

    ``status`` is ``ok``, ``failed`` (import error, misspelled hook, raised while
    declaring model types) or ``incompatible`` (its ``mobius-core`` requirement
    excludes the installed core); ``reason`` says why, and also carries a
    model-type conflict for an ``ok`` plugin.
    """

    name: str
    distribution: str | None
    version: str | None
    model_types: tuple[str, ...] = ()
    status: str = "ok"
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``mobius plugins --json`` (exactly these six keys)."""
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "model_types": list(self.model_types),
            "status": self.status,
            "reason": self.reason,
        }


def hidden_by_allow_list() -> list[str]:
    """Names of installed entry points that ``MOBIUS_PLUGINS`` keeps from loading."""
    allowed = allow_list()
    if allowed is None:
        return []
    return sorted({ep.name for ep in list_entry_points() if ep.name not in allowed})


# --------------------------------------------------------------------------- host


@dataclass
class _Loaded:
    """A registered plugin: its record and the object pluggy knows."""

    record: PluginRecord
    plugin: object
    infos: tuple[ModelTypeInfo, ...] = ()
    builtin: bool = False


@dataclass
class PluginHost:
    """The loaded plugins, their records and the model-type registry.

    Build one with :meth:`load` (entry points, the normal way) or
    :meth:`from_plugins` (explicit plugin objects, for tests and embedding).
    """

    pm: pluggy.PluginManager
    _loaded: dict[str, _Loaded] = field(default_factory=dict)
    _failed: list[PluginRecord] = field(default_factory=list)
    _claims: dict[str, list[str]] = field(default_factory=dict)
    _order: list[str | PluginRecord] = field(default_factory=list)

    # ---------------------------------------------------------------- construction

    @classmethod
    def load(cls, *, builtins: bool = True) -> PluginHost:
        """Load core's built-ins and every allowed entry point of group ``mobius``."""
        return cls.from_plugins({}, load_entry_points=True, builtins=builtins)

    @classmethod
    def from_plugins(
        cls,
        plugins: Mapping[str, object],
        *,
        load_entry_points: bool = False,
        builtins: bool = True,
        distributions: Mapping[str, tuple[str, str]] | None = None,
    ) -> PluginHost:
        """A host with explicit ``plugins`` (name → module or object).

        ``distributions`` optionally gives a plugin's (distribution, version) for
        records and error messages. Explicit plugins are registered after
        entry-point plugins, so they win ``firstresult`` hooks.
        """
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        host = cls(pm)
        if builtins:
            for name, module in BUILTIN_PLUGINS:
                host._load_module(name, module, CORE_DISTRIBUTION, core_version(), builtin=True)
        if load_entry_points:
            host._load_entry_points()
        for name, plugin in plugins.items():
            dist, version = (distributions or {}).get(name, (None, None))
            host._register(name, plugin, dist, version)
        host._check_pending()
        return host

    def _load_module(
        self, name: str, module: str, dist: str | None, version: str | None, *, builtin: bool
    ) -> None:
        def failed(exc: BaseException) -> None:
            self._fail(name, dist, version, f"import of {module} failed: {describe(exc)}")

        plugin = contained(lambda: importlib.import_module(module), failed)
        if plugin is not None:
            self._register(name, plugin, dist, version, builtin=builtin)

    def _load_entry_points(self) -> None:
        allowed = allow_list()
        core = core_version()
        for ep in list_entry_points():
            if allowed is not None and ep.name not in allowed:
                continue
            dist, version, requires = _dist_of(ep)
            if ep.name in self._loaded or any(r.name == ep.name for r in self._failed):
                self._fail(ep.name, dist, version, f"another plugin is already named {ep.name!r}")
                continue
            why = incompatibility(dist, requires, core, version)
            if why is not None:
                self._add_failed(PluginRecord(ep.name, dist, version, (), "incompatible", why))
                continue
            failure: list[BaseException] = []
            plugin = contained(ep.load, failure.append)
            if failure:
                self._fail(ep.name, dist, version, f"import failed: {describe(failure[0])}")
                continue
            self._register(ep.name, plugin, dist, version)

    def _register(
        self,
        name: str,
        plugin: object,
        dist: str | None,
        version: str | None,
        *,
        builtin: bool = False,
    ) -> None:
        """Register one plugin; on any problem unregister it and record it failed."""
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:
            self._fail(name, dist, version, f"rejected by the plugin manager: {describe(exc)}")
            return
        unknown = unknown_hooks(self.pm, plugin)
        if unknown:
            self.pm.unregister(plugin)
            names = ", ".join(unknown)
            self._fail(
                name,
                dist,
                version,
                f"implements unknown hook(s) {names} (misspelled?); "
                f"known hooks: {', '.join(spec_names())}",
            )
            return
        infos: list[ModelTypeInfo] = []
        if implements(self.pm, "mobius_model_types", name):

            def declared() -> list[ModelTypeInfo]:
                answer = list(call_plugin(self.pm, "mobius_model_types", name, {}) or [])
                for info in answer:
                    if not isinstance(getattr(info, "model_type", None), str):
                        raise TypeError(f"expected ModelTypeInfo records, got {info!r}")
                return answer

            failure: list[BaseException] = []
            infos = contained(declared, failure.append) or []
            if failure:
                self.pm.unregister(plugin)
                reason = f"mobius_model_types raised {describe(failure[0])}"
                self._fail(name, dist, version, reason)
                return
        model_types = tuple(info.model_type for info in infos)
        record = PluginRecord(name, dist, version, model_types, "ok", "")
        self._loaded[name] = _Loaded(record, plugin, tuple(infos), builtin)
        self._order.append(name)
        for model_type in model_types:
            self._claims.setdefault(model_type, []).append(name)

    def _fail(self, name: str, dist: str | None, version: str | None, reason: str) -> None:
        self._add_failed(PluginRecord(name, dist, version, (), "failed", reason))

    def _add_failed(self, record: PluginRecord) -> None:
        self._failed.append(record)
        self._order.append(record)

    def _check_pending(self) -> None:
        """pluggy's own check, after per-plugin checks removed misspelled hooks."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:  # pragma: no cover - per-plugin check first
            raise PluginError(
                f"a plugin implements an unknown hook: {exc}",
                where=getattr(getattr(exc, "plugin", None), "__name__", None),
                fix="fix the hook name (see mobius.hookspecs) or uninstall the plugin",
            ) from exc

    # ---------------------------------------------------------------- queries

    def records(self) -> list[PluginRecord]:
        """Every plugin seen, loaded or not; conflicts are marked in ``reason``."""
        out = []
        for entry in self._order:
            if isinstance(entry, PluginRecord):
                out.append(entry)
                continue
            name = entry
            record = self._loaded[name].record
            conflicts = [
                f"model type {mt!r} is also claimed by "
                + ", ".join(self._label(o) for o in self._claims[mt] if o != name)
                for mt in record.model_types
                if len(self._claims.get(mt, ())) > 1
            ]
            if conflicts:
                record = replace(record, reason="; ".join(conflicts))
            out.append(record)
        return out

    def plugin_names(self) -> list[str]:
        """Names of the loaded (status ok) plugins, in registration order."""
        return list(self._loaded)

    def model_types(self) -> dict[str, list[str]]:
        """model_type → names of the plugins claiming it (more than one is a conflict)."""
        return {mt: list(names) for mt, names in self._claims.items()}

    def record(self, name: str) -> PluginRecord:
        """The record of the loaded plugin ``name``."""
        return self._loaded[name].record

    def model_type_info(self, model_type: str) -> ModelTypeInfo:
        """The owner's :class:`ModelTypeInfo` for ``model_type``."""
        owner = self.owner(model_type)
        for info in self._loaded[owner].infos:
            if info.model_type == model_type:
                return info
        raise AssertionError(model_type)  # pragma: no cover - owner() found it

    def owner(self, model_type: str) -> str:
        """The name of the one plugin serving ``model_type``.

        Raises :class:`ConfigError` when no plugin serves it (listing what the
        installed plugins serve) and :class:`PluginError` when two do.
        """
        names = self._claims.get(model_type, [])
        if len(names) == 1:
            return names[0]
        if not names:
            served = [
                f"{r.name} ({r.distribution or '?'}): {', '.join(r.model_types)}"
                for r in self.records()
                if r.status == "ok" and r.model_types
            ]
            broken = [f"{r.name} ({r.status})" for r in self._failed]
            what = f"no installed plugin builds model_type {model_type!r}"
            if served:
                what += "; installed plugins serve: " + "; ".join(served)
            else:
                what += "; no installed plugin serves any model type"
            if broken:
                what += "; not loaded: " + ", ".join(broken) + " (see `mobius plugins`)"
            raise ConfigError(
                what,
                where="config.json: model_type",
                fix=f"{family_install_hint(model_type)}, or check {ENV_ALLOW_LIST}",
            )
        labels = " and ".join(self._label(n) for n in names)
        raise PluginError(
            f"model type {model_type!r} is claimed by more than one plugin: {labels}",
            where=f"entry points of group {ENTRY_POINT_GROUP!r}",
            fix=f"uninstall one of these distributions, or choose one with {ENV_ALLOW_LIST}=<name>",
        )

    def _label(self, name: str) -> str:
        record = self._loaded[name].record
        if record.distribution:
            return f"{record.distribution} {record.version or ''} (plugin {name})".replace(
                "  ", " "
            )
        return f"plugin {name}"

    # ---------------------------------------------------------------- owner-only hooks

    def call_owner(self, model_type: str, hook: str, /, **kwargs: Any) -> Any:
        """Call ``hook`` on the owner of ``model_type`` only and return its answer."""
        owner = self.owner(model_type)
        if not implements(self.pm, hook, owner):
            raise PluginError(
                f"plugin {owner} serves model type {model_type!r} but does not implement {hook}",
                where=f"plugin {owner}",
                fix="report this to the plugin's authors",
            )
        return self._guarded(owner, hook, kwargs)

    def read_config(self, model_type: str, raw: dict[str, Any]) -> Any:
        """The owner's typed config for ``raw`` (``mobius_read_config``)."""
        hook = "mobius_read_config"
        answer = self.call_owner(model_type, hook, model_type=model_type, raw=raw)
        return self._checked(model_type, hook, answer, object, "a config object")

    def pipeline_contract(self, model_type: str, config: Any, options: BuildOptions) -> Contract:
        """The owner's pipeline contract (``mobius_pipeline_contract``)."""
        from mobius.contract import Contract

        hook = "mobius_pipeline_contract"
        answer = self.call_owner(model_type, hook, config=config, options=options)
        return self._checked(model_type, hook, answer, Contract, "a mobius.contract.Contract")

    def build_component(
        self, model_type: str, config: Any, component: str, options: BuildOptions
    ) -> ir.Model:
        """The owner's graph for ``component`` (``mobius_build_component``)."""
        import onnx_ir as ir

        hook = "mobius_build_component"
        answer = self.call_owner(
            model_type, hook, config=config, component=component, options=options
        )
        return self._checked(model_type, hook, answer, ir.Model, "an onnx_ir.Model")

    def weight_plan(
        self,
        model_type: str,
        config: Any,
        component: str,
        checkpoint: Checkpoint,
        options: BuildOptions,
    ) -> WeightPlan:
        """The owner's weight plan for ``component`` (``mobius_weight_plan``)."""
        from mobius.weights import WeightPlan

        hook = "mobius_weight_plan"
        answer = self.call_owner(
            model_type,
            hook,
            config=config,
            component=component,
            checkpoint=checkpoint,
            options=options,
        )
        return self._checked(model_type, hook, answer, WeightPlan, "a mobius.weights.WeightPlan")

    def quant_overrides(
        self, model_type: str, config: Any, component: str, options: BuildOptions
    ) -> dict[str, str]:
        """The owner's quantization overrides (``mobius_quant_overrides``); none if not
        implemented."""
        from mobius.quantization import check_overrides

        owner = self.owner(model_type)
        hook = "mobius_quant_overrides"
        if not implements(self.pm, hook, owner):
            return {}
        kwargs = {"config": config, "component": component, "options": options}
        answer = self._guarded(owner, hook, kwargs)
        return check_overrides(answer, f"plugin {owner}, hook {hook}")

    def processors(self, model_type: str, config: Any) -> Processors:
        """The owner's numpy preprocessing (``mobius_processors``)."""
        return self.call_owner(model_type, "mobius_processors", config=config)

    def runtime_files(
        self,
        model_type: str,
        config: Any,
        contract: Contract,
        checkpoint: Checkpoint,
        options: BuildOptions,
    ) -> list[RuntimeFile]:
        """The owner's extra package files (``mobius_runtime_files``); none if not implemented."""
        owner = self.owner(model_type)
        if not implements(self.pm, "mobius_runtime_files", owner):
            return []
        kwargs = {
            "config": config,
            "contract": contract,
            "checkpoint": checkpoint,
            "options": options,
        }
        from mobius.records import RuntimeFile

        hook = "mobius_runtime_files"
        answer = self._guarded(owner, hook, kwargs)
        if answer is None:
            return []
        files = list(check_answer(owner, hook, answer, (list, tuple), "a list of RuntimeFile"))
        for item in files:
            self._checked(
                model_type, hook, item, RuntimeFile, "only RuntimeFile records in its list"
            )
        return files

    # ---------------------------------------------------------------- broadcast hooks

    def optimize_component(self, model: ir.Model, component: str, target: str) -> ir.Model:
        """Feed ``model`` through every plugin's optimizer, in registration order."""
        hook = "mobius_optimize_component"
        for name in reversed(implementers(self.pm, hook)):
            kwargs = {"model": model, "component": component, "target": target}
            answer = self._guarded(name, hook, kwargs)
            if answer is not None:
                model = check_answer(name, hook, answer, type(model), "an onnx_ir.Model or None")
        return model

    def open_checkpoint(
        self, source: str, revision: str | None, companion: str | None = None
    ) -> Checkpoint | None:
        """The first plugin answer that recognises ``source`` (pluggy's call order).

        A plugin whose opener raises something other than a
        :class:`~mobius.errors.MobiusError` (a bug, not an answer) is marked
        ``failed`` in :meth:`records` and its PluginError is raised: the build
        stops rather than hand the source to the next opener (the Hub's).
        """
        hook = "mobius_open_checkpoint"
        for name in implementers(self.pm, hook):
            kwargs = {"source": source, "revision": revision, "host": self, "companion": companion}
            try:
                answer = self._guarded(name, hook, kwargs)
            except PluginError as exc:
                if exc.plugin_bug:
                    self._mark_failed(name, exc.what)
                raise
            if answer is not None:
                return answer
        return None

    def gguf_translation(
        self, architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, Any]
    ) -> tuple[str, GGUFTranslation]:
        """(plugin, answer) of the first plugin that translates GGUF ``architecture``;
        CheckpointError when none does, PluginError when the answer is no
        :class:`~mobius.records.GGUFTranslation`."""
        from mobius.errors import CheckpointError
        from mobius.records import GGUFTranslation

        hook = "mobius_gguf_translation"
        names = implementers(self.pm, hook)
        for name in names:
            kwargs = {"architecture": architecture, "metadata": metadata, "tensors": tensors}
            answer = self._guarded(name, hook, kwargs)
            if answer is not None:
                expected = "a mobius.records.GGUFTranslation or None"
                return name, check_answer(name, hook, answer, GGUFTranslation, expected)
        served = ", ".join(names) or "none"
        raise CheckpointError(
            f"no installed plugin reads GGUF architecture {architecture!r} "
            f"(plugins with GGUF support: {served})",
            where="GGUF metadata: general.architecture",
            fix="install the mobius family plugin for this architecture, or build the "
            "model's HuggingFace checkpoint instead",
        )

    def gguf_companion_translation(
        self,
        architecture: str,
        metadata: Mapping[str, Any],
        tensors: Mapping[str, Any],
        companion: Any,
    ) -> tuple[str, GGUFTranslation] | None:
        """(plugin, answer) of the first plugin that reads GGUF ``architecture`` with its
        companion file (``mobius_gguf_companion_translation``); None when none does;
        PluginError when the answer is no :class:`~mobius.records.GGUFTranslation`."""
        from mobius.records import GGUFTranslation

        hook = "mobius_gguf_companion_translation"
        for name in implementers(self.pm, hook):
            kwargs = {
                "architecture": architecture,
                "metadata": metadata,
                "tensors": tensors,
                "companion": companion,
            }
            answer = self._guarded(name, hook, kwargs)
            if answer is not None:
                expected = "a mobius.records.GGUFTranslation or None"
                return name, check_answer(name, hook, answer, GGUFTranslation, expected)
        return None

    def add_commands(self, app: typer.Typer) -> list[PluginRecord]:
        """Let every plugin add CLI commands; a plugin that raises is marked failed.

        Returns the records of plugins that failed here (they stay registered for
        building, but ``mobius plugins`` shows the error).
        """
        hook = "mobius_add_commands"
        failed = []
        for name in reversed(implementers(self.pm, hook)):
            failure: list[BaseException] = []
            contained(lambda n=name: call_plugin(self.pm, hook, n, {"app": app}), failure.append)
            if failure:
                failed.append(self._mark_failed(name, f"{hook} raised {describe(failure[0])}"))
        return failed

    def _mark_failed(self, name: str, reason: str) -> PluginRecord:
        """Record that a loaded plugin failed in a hook (``mobius plugins`` shows it)."""
        loaded = self._loaded[name]
        loaded.record = replace(loaded.record, status="failed", reason=reason)
        return loaded.record

    # ---------------------------------------------------------------- helpers

    def _checked(self, model_type: str, hook: str, answer: Any, kind: type, expected: str) -> Any:
        return check_answer(self.owner(model_type), hook, answer, kind, expected)

    def _guarded(self, plugin: str, hook: str, kwargs: dict[str, Any]) -> Any:
        """Call ``hook`` of ``plugin`` alone; whatever it raises becomes a PluginError
        naming plugin and hook (a MobiusError keeps its text and gains a ``where``)."""

        def failed(exc: BaseException) -> Any:
            if isinstance(exc, MobiusError):
                if not exc.where:
                    exc.where = f"plugin {plugin} ({hook})"
                    exc.args = (exc.render(),)
                raise exc
            record = self._loaded[plugin].record if plugin in self._loaded else None
            who = f"plugin {plugin}"
            if record is not None and record.distribution:
                who += f" ({record.distribution} {record.version})"
            error = PluginError(
                f"{who} raised in {hook}: {describe(exc)}",
                where=f"plugin {plugin}, hook {hook}",
                fix="this is a bug in the plugin; rerun with --debug for the traceback "
                "and report it to the plugin's authors",
            )
            error.plugin_bug = True
            raise error from exc

        return contained(lambda: call_plugin(self.pm, hook, plugin, kwargs), failed)
