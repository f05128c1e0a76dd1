"""pytest plugin of mobius-testing (entry point ``pytest11: mobius``).

Markers: ``l1`` build, ``l2`` architecture, ``l3`` synthetic parity, ``l4`` golden
logits, ``l5`` golden generation, ``gpu`` needs a CUDA device, ``reference`` needs
the ``[reference]`` extra, ``family(name)`` the model family of a test.

Options: ``--levels l1,l2,...`` (tests of other levels skip with the reason),
``--families gemma4,...``, ``--golden-dir DIR`` (default: ``goldens/`` beside each
case file), ``--device auto|cpu|cuda`` (``gpu`` tests skip unless it resolves to cuda).

Fixtures (session-scoped factories, shared with the collected case items):
``mobius_build(source, dtype=, target=, revision=) -> package folder`` (cached per
session), ``mobius_pipeline(package) -> mobius_runtime.Pipeline``, ``hf_reference(source,
...) -> HFReference`` (skips without the extra), ``mobius_device``, ``golden_dir``.

Case files (``*.case.toml``) anywhere under the test paths are collected as L4/L5
items (see :mod:`mobius_testing.collect`); the plugin knows no model family.
Low-confidence golden comparisons get their own outcome (``L`` /
``LOW-CONFIDENCE``), a warning, and a summary section. A session that collected case
files ends with a ``mobius golden cases`` section (:mod:`mobius_testing.summary`):
how many case items ran, and ``NO GOLDEN CASE RAN`` when none did.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

LEVEL_MARKERS = ("l1", "l2", "l3", "l4", "l5")
MARKERS = {
    "l1": "L1 build: tiny config builds, onnx.checker + shape inference, contract validates",
    "l2": "L2 architecture: full-size configs build without weights; geometry and counts",
    "l3": "L3 synthetic parity: tiny random checkpoints, ORT vs HF",
    "l4": "L4 golden logits: real checkpoint, one prefill vs stored golden",
    "l5": "L5 golden generation: real checkpoint, greedy ids vs stored golden",
    "gpu": "needs a CUDA device (skipped unless --device resolves to cuda)",
    "reference": "needs the [reference] extra (torch, transformers)",
    "real": "a real checkpoint that `tox -e real` fetches (MOBIUS_REAL_MODELS); deselected elsewhere",
    "family(name)": "the model family of a test (selected with --families)",
}
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class HarnessState:
    """What one pytest session shares between fixtures and collected case items."""

    config: pytest.Config
    levels: frozenset[str] | None
    families: frozenset[str] | None
    golden_dir: Path | None
    device_option: str
    _device: str | None = None
    _tmp: Path | None = None
    _builds: Any = None
    _pipelines: Any = None
    _references: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    cases: Any = None  # mobius_testing.summary.CaseTally, set at collection

    @property
    def device(self) -> str:
        """``--device`` resolved (``auto`` → cuda when onnxruntime can run it, else cpu)."""
        if self._device is None:
            if self.device_option == "cpu":
                self._device = "cpu"
            else:
                from mobius.errors import MobiusError
                from mobius_runtime.device import resolve_device

                try:
                    self._device = resolve_device(self.device_option)
                except MobiusError as exc:
                    raise pytest.UsageError(f"--device {self.device_option}: {exc}") from exc
        return self._device

    @property
    def tmp(self) -> Path:
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="mobius-harness-"))
        return self._tmp

    @property
    def builds(self):
        """The session's :class:`~mobius_testing.runner.BuildCache` (replaceable, e.g. by a
        conftest that serves prebuilt packages)."""
        if self._builds is None:
            from mobius_testing.runner import BuildCache

            self._builds = BuildCache(self.tmp / "packages")
        return self._builds

    @builds.setter
    def builds(self, value: Any) -> None:
        self._builds = value

    @property
    def pipelines(self):
        """The session's :class:`~mobius_testing.runner.PipelineCache` (replaceable)."""
        if self._pipelines is None:
            from mobius_testing.runner import PipelineCache

            self._pipelines = PipelineCache(self.device)
        return self._pipelines

    @pipelines.setter
    def pipelines(self, value: Any) -> None:
        self._pipelines = value

    def cleanup(self) -> None:
        self._pipelines = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


_STATE = pytest.StashKey[HarnessState]()


def harness_state(config: pytest.Config) -> HarnessState:
    return config.stash[_STATE]


def _csv(value: str | None, allowed: tuple[str, ...] | None, option: str) -> frozenset[str] | None:
    if not value:
        return None
    items = frozenset(v.strip().lower() for v in value.split(",") if v.strip())
    if allowed is not None:
        bad = sorted(items - set(allowed))
        if bad:
            raise pytest.UsageError(
                f"{option}: unknown value(s) {', '.join(bad)}; use a comma list of "
                f"{', '.join(allowed)}"
            )
    return items


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mobius", "mobius golden harness")
    group.addoption(
        "--levels",
        default=None,
        help="comma list of harness levels to run (l1..l5); tests of other levels skip",
    )
    group.addoption(
        "--families",
        default=None,
        help="comma list of model families to run (tests marked family(...) / case files)",
    )
    group.addoption(
        "--golden-dir",
        default=None,
        help="folder of golden files (default: goldens/ beside each case file)",
    )
    group.addoption(
        "--device",
        default="auto",
        choices=DEVICES,
        help="device for mobius_runtime pipelines: auto (cuda when usable), cpu, cuda",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    golden = config.getoption("--golden-dir", None)
    config.stash[_STATE] = HarnessState(
        config=config,
        levels=_csv(config.getoption("--levels", None), LEVEL_MARKERS, "--levels"),
        families=_csv(config.getoption("--families", None), None, "--families"),
        golden_dir=Path(golden).resolve() if golden else None,
        device_option=config.getoption("--device", "auto") or "auto",
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.cleanup()


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    from mobius_testing.collect import CaseFile, is_case_file

    if is_case_file(file_path):
        return CaseFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = harness_state(config)
    for item in items:
        levels = [m.name for m in item.iter_markers() if m.name in LEVEL_MARKERS]
        if state.levels is not None and levels and not set(levels) & state.levels:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"level {','.join(levels)} not selected "
                    f"(--levels {','.join(sorted(state.levels))})"
                )
            )
            continue
        fam = item.get_closest_marker("family")
        if state.families is not None and fam is not None and fam.args:
            name = str(fam.args[0]).lower()
            if name not in state.families:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"family {name} not selected "
                        f"(--families {','.join(sorted(state.families))})"
                    )
                )
                continue
        if item.get_closest_marker("gpu") is not None and state.device != "cuda":
            item.add_marker(
                pytest.mark.skip(
                    reason="needs a GPU: run with --device cuda on a machine where onnxruntime "
                    f"can use CUDA (here --device {state.device_option} means {state.device})"
                )
            )


def pytest_deselected(items: list[pytest.Item]) -> None:
    from mobius_testing.collect import GoldenItem

    golden = [i for i in items if isinstance(i, GoldenItem)]
    if golden:
        state = harness_state(golden[0].config)
        state.cases = state.cases or _tally()
        state.cases.deselected += len(golden)


def pytest_collection_finish(session: pytest.Session) -> None:
    from mobius_testing.collect import GoldenItem

    state = harness_state(session.config)
    state.cases = state.cases or _tally()
    state.cases.selected = [i.nodeid for i in session.items if isinstance(i, GoldenItem)]


def _tally():
    from mobius_testing.summary import CaseTally

    return CaseTally()


# ---------------------------------------------------------------------- reporting


def _outcome(report: pytest.TestReport) -> str | None:
    for name, value in getattr(report, "user_properties", ()):
        if name == "mobius_outcome":
            return str(value)
    return None


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    if report.when == "call" and report.passed and _outcome(report) == "low-confidence":
        return "low-confidence", "L", ("LOW-CONFIDENCE", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None and state.cases is not None:
        from mobius_testing.summary import write_terminal

        write_terminal(terminalreporter, state.cases)
    low = terminalreporter.stats.get("low-confidence", [])
    if not low:
        return
    terminalreporter.section("mobius low-confidence golden comparisons", sep="=", yellow=True)
    for report in low:
        text = dict(report.user_properties).get("mobius_report", "")
        terminalreporter.write_line(f"{report.nodeid}")
        for line in str(text).splitlines():
            terminalreporter.write_line(f"    {line}")


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def mobius_device(pytestconfig: pytest.Config) -> str:
    """``--device`` resolved to ``cpu`` or ``cuda``."""
    return harness_state(pytestconfig).device


@pytest.fixture(scope="session")
def golden_dir(pytestconfig: pytest.Config) -> Path | None:
    """``--golden-dir`` (absolute) or None: each case then uses ``goldens/`` beside its file."""
    return harness_state(pytestconfig).golden_dir


@pytest.fixture(scope="session")
def mobius_build(pytestconfig: pytest.Config):
    """Build a package from a checkpoint: ``mobius_build(source, dtype="f32", target="default",
    revision=None) -> Path``; each (source, revision, dtype, target) is built once per session."""
    return harness_state(pytestconfig).builds.build


@pytest.fixture(scope="session")
def mobius_pipeline(pytestconfig: pytest.Config):
    """Load a package with the runtime: ``mobius_pipeline(package, device=None) -> Pipeline``
    (``--device`` by default), cached per (package, device)."""
    return harness_state(pytestconfig).pipelines.load


@pytest.fixture(scope="session")
def hf_reference(pytestconfig: pytest.Config):
    """Load an HF reference model: ``hf_reference(source, revision=None, dtype="float32",
    media=False) -> mobius_testing.reference.HFReference`` (cached). Skips the test with the
    install command when the ``[reference]`` extra (torch, transformers) is missing."""
    from mobius_testing.reference import HFReference, missing_reference

    reason = missing_reference()
    if reason:
        pytest.skip(reason)
    state = harness_state(pytestconfig)

    def load(
        source: str | Path, revision: str | None = None, dtype: str = "float32", media: bool = False
    ) -> HFReference:
        key = (str(source), revision, dtype, media)
        if key not in state._references:
            state._references[key] = HFReference.load(
                str(source),
                revision=revision,
                device="auto" if state.device == "cuda" else "cpu",
                dtype=dtype,
                media=media,
            )
        return state._references[key]

    return load
