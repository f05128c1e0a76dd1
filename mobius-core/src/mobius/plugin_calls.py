"""Calling plugin code: through pluggy's hook callers, with every failure contained.

Why through pluggy (``PluginManager.subset_hook_caller``) and not
``impl.function`` directly: pluggy's machinery keeps working for owner-only
calls — call tracing (``pm.trace``, ``add_hookcall_monitoring``) and wrappers
(``wrapper=True`` / ``hookwrapper=True`` implementations of any plugin). A
subset caller keeps the chosen plugin's implementation and every wrapper, and
removes the other plugins' ordinary implementations.

Why :func:`contained` catches ``BaseException``: a plugin may call
``sys.exit()``, raise ``KeyboardInterrupt`` or a ``BaseException`` subclass of its
own at import or in a hook; that must cost the plugin, not the CLI. A *real*
Ctrl-C or SIGTERM must still stop the program, so while plugin code runs in the
main thread the SIGINT and SIGTERM handlers are wrapped to count signals that
arrive: an exception raised after one arrived is passed on, one raised without
a signal is the plugin's own doing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pluggy

from mobius import hookspecs
from mobius.errors import PluginError

_received = 0
"""Real SIGINT/SIGTERM signals seen while plugin code ran (see :func:`_watch_signals`)."""


@contextlib.contextmanager
def _watch_signals() -> Iterator[Callable[[], bool]]:
    """Yield ``arrived()``: whether a real SIGINT/SIGTERM came while the block ran.

    The previous handlers still run (the default SIGINT handler raises
    KeyboardInterrupt, the CLI's SIGTERM handler raises its own exception). Off
    the main thread no handler can be installed, and no signal is delivered
    there either, so every exception there is the plugin's.
    """
    global _received
    start = _received
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    previous: dict[int, Any] = {}

    def counting(signum: int, frame: Any) -> None:
        global _received
        _received += 1
        handler = previous.get(signum)
        if callable(handler):
            handler(signum, frame)
        elif signum == signal.SIGINT and handler != signal.SIG_IGN:
            raise KeyboardInterrupt
        elif handler == signal.SIG_DFL:  # SIGTERM's default: end the process
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is None:  # installed outside Python: leave it alone
            continue
        with contextlib.suppress(ValueError, OSError):  # not the main interpreter
            previous[signum] = signal.signal(signum, counting)
    try:
        yield lambda: _received != start
    finally:
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, handler)


def contained(run: Callable[[], Any], on_error: Callable[[BaseException], Any]) -> Any:
    """``run()``; any exception it raises goes to ``on_error`` (whose result is returned,
    or which raises), except one that follows a real SIGINT/SIGTERM, which propagates."""
    with _watch_signals() as arrived:
        try:
            return run()
        except BaseException as exc:
            if arrived() or isinstance(exc, GeneratorExit):
                raise
            return on_error(exc)


def is_wrapper(impl: Any) -> bool:
    """Whether ``impl`` wraps other implementations (pluggy's new or old style)."""
    return bool(getattr(impl, "wrapper", False) or getattr(impl, "hookwrapper", False))


def call_plugin(
    pm: pluggy.PluginManager, hook: str, plugin_name: str, kwargs: Mapping[str, Any]
) -> Any:
    """Call ``hook`` of the plugin ``plugin_name`` alone (wrappers included); its answer.

    The other plugins' ordinary implementations are left out with
    ``subset_hook_caller``; the answer of a non-``firstresult`` hook (a list of
    at most one item) is unwrapped to that item, or None.
    """
    caller = getattr(pm.hook, hook)
    others = [
        impl.plugin
        for impl in caller.get_hookimpls()
        if impl.plugin_name != plugin_name and not is_wrapper(impl)
    ]
    subset = pm.subset_hook_caller(hook, remove_plugins=others)
    answer = subset(**kwargs)
    spec = caller.spec
    if spec is not None and spec.opts.get("firstresult"):
        return answer
    return answer[0] if answer else None


def implementers(pm: pluggy.PluginManager, hook: str) -> list[str]:
    """Names of the plugins with an ordinary implementation of ``hook``, in call order
    (pluggy calls the last registered first)."""
    impls = getattr(pm.hook, hook).get_hookimpls()
    return [impl.plugin_name for impl in reversed(impls) if not is_wrapper(impl)]


def implements(pm: pluggy.PluginManager, hook: str, plugin_name: str) -> bool:
    """Whether plugin ``plugin_name`` has an ordinary implementation of ``hook``."""
    return plugin_name in implementers(pm, hook)


def check_answer(
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


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception (``SystemExit: 3`` for ``sys.exit(3)``)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def spec_names() -> list[str]:
    """Every hook name core declares."""
    return sorted(n for n in dir(hookspecs) if n.startswith("mobius_"))


def unknown_hooks(pm: pluggy.PluginManager, plugin: object) -> list[str]:
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
