"""Shared fixtures of the mobius-gemma4 tests.

The harness (mobius-testing's pytest plugin) supplies the levels, ``--levels`` /
``--families`` selection, ``mobius_build`` / ``mobius_pipeline`` / ``hf_reference``
and the L4/L5 case files (tests/cases); every test here is marked
``family("gemma4")``. Packages run only through ``mobius_runtime.Pipeline``
(reference/run.py).

The L3 parity fixtures make tiny random checkpoints with HF transformers (torch,
CPU) once per session and cache builds by (model, config shape, dtype, target), so
the whole L3 suite stays within a few minutes on two cores. torch and
transformers are imported only when a reference fixture is requested.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

PREFILL = 24
"""Prompt length: three times the sliding window (8) of every tiny config."""
DECODE = 16
"""Cached single-token decode steps after the prefill."""
SEED = 1234


@pytest.fixture(scope="session")
def parity_ids() -> np.ndarray:
    """Token ids ``[1, PREFILL + DECODE]``: no specials, no multimodal placeholders."""
    from reference.specs import MAX_PROMPT_ID

    rng = np.random.default_rng(SEED)
    return rng.integers(3, MAX_PROMPT_ID, size=(1, PREFILL + DECODE), dtype=np.int64)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``family("gemma4")`` (before the harness filters)."""
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("family") is None and here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.family("gemma4"))


class ReferenceCache:
    """Checkpoints, HF logits and mobius builds, each made once per session.

    Builds here (not the harness's ``mobius_build``) because the L3 tests read the
    ``BuildResult`` (unused tensors, components) and the build log, which the harness
    cache, returning only the package folder, does not keep; the bundled checkpoint's
    test uses ``mobius_build``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._pairs: dict[str, object] = {}
        self._hf: dict[tuple[str, str], np.ndarray] = {}
        self._builds: dict[tuple[str, str, str, str], object] = {}
        self._logs: dict[tuple[str, str, str, str], list[str]] = {}

    def checkpoint(self, name: str):
        """The :class:`reference.fixtures.CheckpointPair` of spec ``name``."""
        if name not in self._pairs:
            from reference.fixtures import make_checkpoint
            from reference.specs import SPECS

            self._pairs[name] = make_checkpoint(SPECS[name], self.root / "ckpt" / name)
        return self._pairs[name]

    def hf_logits(self, name: str, ids: np.ndarray, style: str = "saved") -> np.ndarray:
        """HF float32 no-cache logits ``[B, T, V]`` of ``ids``."""
        key = (name, style)
        if key not in self._hf:
            from reference.hf_runner import hf_logits, load_model

            pair = self.checkpoint(name)
            model = load_model(getattr(pair, style), pair.spec.model_type)
            self._hf[key] = hf_logits(model, ids)
        return self._hf[key]

    def build(self, name: str, style: str = "saved", dtype: str = "f32", target: str = "default"):
        """``mobius.build`` of the checkpoint; returns the BuildResult (``.out`` = package)."""
        key = (name, style, dtype, target)
        if key not in self._builds:
            import logging

            import mobius

            records: list[str] = []

            class _Keep(logging.Handler):
                def emit(self, record: logging.LogRecord) -> None:
                    records.append(record.getMessage())

            handler = _Keep(level=logging.DEBUG)
            logger = logging.getLogger("mobius")
            old_level = logger.level
            logger.addHandler(handler)
            logger.setLevel(logging.DEBUG)
            try:
                folder = getattr(self.checkpoint(name), style)
                out = self.root / "pkg" / "-".join(key)
                self._builds[key] = mobius.build(str(folder), str(out), dtype=dtype, target=target)
            finally:
                logger.removeHandler(handler)
                logger.setLevel(old_level)
            self._logs[key] = records
        return self._builds[key]

    def build_log(
        self, name: str, style: str = "saved", dtype: str = "f32", target: str = "default"
    ):
        """Log messages (``mobius.*`` loggers) emitted while building that package."""
        self.build(name, style, dtype, target)
        return self._logs[(name, style, dtype, target)]


@pytest.fixture(scope="session")
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> ReferenceCache:
    """Session cache of tiny checkpoints, HF reference logits and packages (needs torch)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return ReferenceCache(tmp_path_factory.mktemp("gemma4-l3"))
