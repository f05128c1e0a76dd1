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
- owner-only calls reach the owning plugin's implementation alone, and any
  exception a plugin raises is a :class:`~mobius.errors.PluginError` naming the
  plugin and the hook.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pluggy

from mobius import hookspecs
from mobius.errors import ConfigError, MobiusError, PluginError

if TYPE_CHECKING:
    import onnx_ir as ir
    import typer

    from mobius.checkpoint import Checkpoint
    from mobius.contract import Contract
    from mobius.records import BuildOptions, ModelTypeInfo, Processors, RuntimeFile
    from mobius.weights import WeightPlan

ENTRY_POINT_GROUP = "mobius"
ENV_ALLOW_LIST = "MOBIUS_PLUGINS"
CORE_DISTRIBUTION = "mobius-core"

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


# --------------------------------------------------------------------------- environment


def list_entry_points() -> list[Any]:
    """The installed entry points of group ``mobius`` (tests monkeypatch this)."""
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


def core_version() -> str:
    """The installed ``mobius-core`` version (metadata first, the package as fallback)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(CORE_DISTRIBUTION)
    except PackageNotFoundError:
        from mobius import __version__

        return __version__


def allow_list() -> set[str] | None:
    """Entry-point names allowed by ``MOBIUS_PLUGINS``; ``None`` when unset (all allowed)."""
    raw = os.environ.get(ENV_ALLOW_LIST)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _dist_of(entry_point: Any) -> tuple[str | None, str | None, list[str]]:
    """(distribution name, version, Requires-Dist lines) of an entry point, when known."""
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None, None, []
    try:
        name = dist.metadata["Name"]
    except Exception:
        name = getattr(dist, "name", None)
    return name, getattr(dist, "version", None), list(getattr(dist, "requires", None) or [])


def incompatibility(
    distribution: str | None, requires: Iterable[str], core: str, version: str | None = None
) -> str | None:
    """Why ``distribution`` (at ``version``) cannot run with core ``core``, or ``None``.

    Reads the distribution's ``Requires-Dist`` lines; only an unconditional
    requirement on ``mobius-core`` (or one whose marker holds here, extras
    excluded) counts. The message names the plugin's version, the range it
    requires, the installed core and the ``pip install`` that fixes it, since
    the person reading it is usually one command away from a working install.
    """
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != CORE_DISTRIBUTION:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            ok = req.specifier.contains(Version(core), prereleases=True)
        except InvalidVersion:
            ok = True
        if not ok:
            return _incompatible_message(distribution, version, str(req.specifier), core)
    return None


def _incompatible_message(
    distribution: str | None, version: str | None, spec: str, core: str
) -> str:
    """The ``incompatible`` reason: both versions, the range, and the command that fixes it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    who = f"{distribution} {version}" if distribution and version else distribution
    who = who or "this plugin"
    installed = Version(core)
    # core above the plugin's upper bound: a newer plugin release may support it
    too_new = any(
        s.operator in ("<", "<=") and not s.contains(installed, prereleases=True)
        for s in SpecifierSet(spec)
    )
    message = (
        f"{who} requires mobius-core{spec}, but mobius-core {core} is installed; "
        f"fix: pip install 'mobius-core{spec}' (replaces mobius-core {core})"
    )
    if too_new and distribution:
        message += f", or keep it and upgrade the plugin: pip install -U {distribution}"
    return message


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
        try:
            plugin = importlib.import_module(module)
        except Exception as exc:
            self._fail(name, dist, version, f"import of {module} failed: {_describe(exc)}")
            return
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
            try:
                plugin = ep.load()
            except Exception as exc:
                self._fail(ep.name, dist, version, f"import failed: {_describe(exc)}")
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
            self._fail(name, dist, version, f"rejected by the plugin manager: {_describe(exc)}")
            return
        unknown = _unknown_hooks(self.pm, plugin)
        if unknown:
            self.pm.unregister(plugin)
            names = ", ".join(unknown)
            self._fail(
                name,
                dist,
                version,
                f"implements unknown hook(s) {names} (misspelled?); "
                f"known hooks: {', '.join(_spec_names())}",
            )
            return
        infos: list[ModelTypeInfo] = []
        impl = _impl_of(self.pm, "mobius_model_types", name)
        if impl is not None:
            try:
                answer = _call_impl(impl, {})
                infos = list(answer or [])
                for info in infos:
                    if not isinstance(getattr(info, "model_type", None), str):
                        raise TypeError(f"expected ModelTypeInfo records, got {info!r}")
            except Exception as exc:
                self.pm.unregister(plugin)
                self._fail(name, dist, version, f"mobius_model_types raised {_describe(exc)}")
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
                fix="install the plugin for this model family (pip install mobius-<family>), "
                "or check MOBIUS_PLUGINS",
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
        impl = _impl_of(self.pm, hook, owner)
        if impl is None:
            raise PluginError(
                f"plugin {owner} serves model type {model_type!r} but does not implement {hook}",
                where=f"plugin {owner}",
                fix="report this to the plugin's authors",
            )
        return self._guarded(owner, hook, impl, kwargs)

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
        impl = _impl_of(self.pm, hook, owner)
        if impl is None:
            return {}
        kwargs = {"config": config, "component": component, "options": options}
        answer = self._guarded(owner, hook, impl, kwargs)
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
        impl = _impl_of(self.pm, "mobius_runtime_files", owner)
        if impl is None:
            return []
        kwargs = {
            "config": config,
            "contract": contract,
            "checkpoint": checkpoint,
            "options": options,
        }
        from mobius.records import RuntimeFile

        hook = "mobius_runtime_files"
        answer = self._guarded(owner, hook, impl, kwargs)
        if answer is None:
            return []
        files = list(_check_answer(owner, hook, answer, (list, tuple), "a list of RuntimeFile"))
        for item in files:
            self._checked(
                model_type, hook, item, RuntimeFile, "only RuntimeFile records in its list"
            )
        return files

    # ---------------------------------------------------------------- broadcast hooks

    def optimize_component(self, model: ir.Model, component: str, target: str) -> ir.Model:
        """Feed ``model`` through every plugin's optimizer, in registration order."""
        hook = "mobius_optimize_component"
        for impl in getattr(self.pm.hook, hook).get_hookimpls():
            kwargs = {"model": model, "component": component, "target": target}
            answer = self._guarded(impl.plugin_name, hook, impl, kwargs)
            if answer is not None:
                model = _check_answer(
                    impl.plugin_name, hook, answer, type(model), "an onnx_ir.Model or None"
                )
        return model

    def open_checkpoint(self, source: str, revision: str | None) -> Checkpoint | None:
        """The first plugin answer that recognises ``source`` (pluggy's call order)."""
        hook = "mobius_open_checkpoint"
        # pluggy calls the last-registered implementation first; follow its order.
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            kwargs = {"source": source, "revision": revision}
            answer = self._guarded(impl.plugin_name, hook, impl, kwargs)
            if answer is not None:
                return answer
        return None

    def add_commands(self, app: typer.Typer) -> list[PluginRecord]:
        """Let every plugin add CLI commands; a plugin that raises is marked failed.

        Returns the records of plugins that failed here (they stay registered for
        building, but ``mobius plugins`` shows the error).
        """
        hook = "mobius_add_commands"
        failed = []
        for impl in getattr(self.pm.hook, hook).get_hookimpls():
            try:
                _call_impl(impl, {"app": app})
            except Exception as exc:
                loaded = self._loaded[impl.plugin_name]
                loaded.record = replace(
                    loaded.record,
                    status="failed",
                    reason=f"mobius_add_commands raised {_describe(exc)}",
                )
                failed.append(loaded.record)
        return failed

    # ---------------------------------------------------------------- helpers

    def _checked(self, model_type: str, hook: str, answer: Any, kind: type, expected: str) -> Any:
        return _check_answer(self.owner(model_type), hook, answer, kind, expected)

    def _guarded(self, plugin: str, hook: str, impl: Any, kwargs: dict[str, Any]) -> Any:
        try:
            return _call_impl(impl, kwargs)
        except MobiusError as exc:
            if not exc.where:
                exc.where = f"plugin {plugin} ({hook})"
                exc.args = (exc.render(),)
            raise
        except Exception as exc:
            record = self._loaded[plugin].record if plugin in self._loaded else None
            who = f"plugin {plugin}"
            if record is not None and record.distribution:
                who += f" ({record.distribution} {record.version})"
            raise PluginError(
                f"{who} raised in {hook}: {_describe(exc)}",
                where=f"plugin {plugin}, hook {hook}",
                fix="this is a bug in the plugin; rerun with --debug for the traceback "
                "and report it to the plugin's authors",
            ) from exc


# --------------------------------------------------------------------------- pluggy helpers


def _check_answer(
    plugin: str, hook: str, answer: Any, kind: type | tuple[type, ...], expected: str
) -> Any:
    """``answer`` if it is a ``kind`` (and not None); else a PluginError naming plugin and hook.

    Why: a hook that returns nothing or the wrong thing would otherwise fail
    later, deep in core, as an AttributeError that blames no one.
    """
    if answer is None or not isinstance(answer, kind):
        raise PluginError(
            f"plugin {plugin} returned {type(answer).__name__} from {hook}, expected {expected}",
            where=f"plugin {plugin}, hook {hook}",
            fix="this is a bug in the plugin; report it to the plugin's authors",
        )
    return answer


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _spec_names() -> list[str]:
    return sorted(n for n in dir(hookspecs) if n.startswith("mobius_"))


def _unknown_hooks(pm: pluggy.PluginManager, plugin: object) -> list[str]:
    """Hook names ``plugin`` implements that no spec declares (what check_pending catches)."""
    unknown = []
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin and not impl.optionalhook:
                unknown.append(caller.name)
                break
    return sorted(unknown)


def _impl_of(pm: pluggy.PluginManager, hook: str, plugin_name: str) -> Any:
    for impl in getattr(pm.hook, hook).get_hookimpls():
        if impl.plugin_name == plugin_name:
            return impl
    return None


def _call_impl(impl: Any, kwargs: Mapping[str, Any]) -> Any:
    """Call one implementation with just the arguments it names (pluggy's rule)."""
    function: Callable[..., Any] = impl.function
    return function(*(kwargs[name] for name in impl.argnames))
