"""The shared harness of mobius's fuzz tests: budget, per-example guard, example counts.

Why one module: every reader of untrusted input (safetensors headers, config.json,
a family's config records) is fuzzed the same way, and the budget knob, the guard
and the counts CI collects must mean the same in every fuzz test module.

- Budget: two Hypothesis profiles, ``mobius-fuzz-ci`` (200 examples per target,
  the default) and ``mobius-fuzz-long`` (20 000 per target, ``tox -e fuzz``),
  chosen by ``MOBIUS_FUZZ_PROFILE`` = ``ci`` | ``long``. Decorate a test with
  :data:`FUZZ` (the chosen profile) above ``@given``.
- Guard: :func:`guard` fails one example that runs longer than
  :data:`TIME_LIMIT_S` (SIGALRM raises :class:`ExampleHung`, which is no
  MobiusError, so it fails a test that only tolerates MobiusErrors) or that grows
  the address space by more than :data:`MEMORY_LIMIT` (RLIMIT_AS: the allocation
  raises MemoryError). POSIX only, main thread only (signals).
- Counts: a module keeps a ``Counter`` of examples per target and declares
  ``_report_counts = report_counts(COUNTS)``; at the end of the module the counts
  are printed (past pytest's capture) and, when ``MOBIUS_FUZZ_COUNTS`` names a file,
  appended to it as JSON lines ``{"profile", "target", "examples"}``.

Needs Hypothesis (the ``[fuzz]`` extra); the pytest plugin never imports this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

PROFILE_ENV = "MOBIUS_FUZZ_PROFILE"
COUNTS_ENV = "MOBIUS_FUZZ_COUNTS"

_COMMON: dict[str, Any] = {
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}
settings.register_profile(
    "mobius-fuzz-ci", max_examples=200, deadline=timedelta(seconds=2), **_COMMON
)
settings.register_profile(
    "mobius-fuzz-long", max_examples=20_000, deadline=timedelta(seconds=5), **_COMMON
)
PROFILE = os.environ.get(PROFILE_ENV, "ci")
"""The budget in force: ``ci`` or ``long``."""
FUZZ = settings.get_profile(f"mobius-fuzz-{PROFILE}")
"""The Hypothesis settings of :data:`PROFILE`, used as a decorator."""

TIME_LIMIT_S = 10.0
"""Wall time one guarded example may take."""
MEMORY_LIMIT = 1 << 30
"""Address space a guarded example may add on top of the process (1 GiB)."""


class ExampleHung(Exception):
    """Raised by the guard when one example runs longer than TIME_LIMIT_S (not a MobiusError)."""


def _vm_bytes() -> int | None:
    """The process's current virtual size, or None where /proc is not there to say."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Fail one example that hangs (SIGALRM) or grabs more than MEMORY_LIMIT (RLIMIT_AS)."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise ExampleHung(f"example ran longer than {TIME_LIMIT_S} s")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = _vm_bytes()
    if vm is not None:
        cap = vm + MEMORY_LIMIT
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)


def write_counts(counts: Counter[str], config: pytest.Config) -> None:
    """Print ``counts`` past pytest's capture and append them to ``$MOBIUS_FUZZ_COUNTS``."""
    lines = [f"fuzz[{PROFILE}] {target}: {n} examples" for target, n in sorted(counts.items())]
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        print("\n" + "\n".join(lines))
    if out := os.environ.get(COUNTS_ENV):
        with open(out, "a", encoding="utf-8") as f:
            for target, n in sorted(counts.items()):
                f.write(json.dumps({"profile": PROFILE, "target": target, "examples": n}) + "\n")


def report_counts(counts: Counter[str]) -> Callable[..., Any]:
    """A module-scoped autouse fixture that reports ``counts`` when the module is done.

    Assign it to a module-level name in the test module (pytest finds fixtures by
    attribute): ``_report_counts = report_counts(COUNTS)``.
    """

    @pytest.fixture(scope="module", autouse=True)
    def _report_counts(request: pytest.FixtureRequest) -> Iterator[None]:
        yield
        write_counts(counts, request.config)

    return _report_counts
