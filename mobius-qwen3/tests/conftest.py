"""Shared fixtures of the mobius-qwen3 tests.

Tests are marked ``family("qwen3")`` for the harness of mobius-testing. The L3 parity
fixtures make tiny random checkpoints with HF transformers (torch, CPU) once per
session (qwen3_ref/) and cache builds by (spec, config shape, dtype, target); torch and
transformers are imported only when a reference fixture is requested.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

PREFILL = 24
"""Prompt length: three sliding windows (8) of the windowed spec."""
DECODE = 16
"""Cached single-token decode steps after the prefill."""
SEED = 1234
REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "testdata"


@pytest.fixture(scope="session")
def parity_ids() -> np.ndarray:
    from qwen3_ref.specs import MAX_PROMPT_ID

    rng = np.random.default_rng(SEED)
    return rng.integers(3, MAX_PROMPT_ID, size=(1, PREFILL + DECODE), dtype=np.int64)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``family("qwen3")`` (before the harness filters)."""
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("family") is None and here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.family("qwen3"))


class ReferenceCache:
    """Checkpoints, HF logits and mobius builds, each made once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._pairs: dict[str, object] = {}
        self._hf: dict[str, object] = {}
        self._builds: dict[tuple[str, str, str, str], object] = {}

    def checkpoint(self, name: str):
        if name not in self._pairs:
            from qwen3_ref.fixtures import make_checkpoint
            from qwen3_ref.specs import SPECS

            self._pairs[name] = make_checkpoint(name, SPECS[name], self.root / "ckpt" / name)
        return self._pairs[name]

    def model(self, name: str):
        if name not in self._hf:
            from qwen3_ref.hf_runner import load_model

            pair = self.checkpoint(name)
            self._hf[name] = load_model(pair.saved, pair.model_type)
        return self._hf[name]

    def build(self, name: str, style: str = "saved", dtype: str = "f32", target: str = "default"):
        key = (name, style, dtype, target)
        if key not in self._builds:
            import mobius

            folder = getattr(self.checkpoint(name), style)
            out = self.root / "pkg" / "-".join(key)
            self._builds[key] = mobius.build(str(folder), str(out), dtype=dtype, target=target)
        return self._builds[key]


@pytest.fixture(scope="session")
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> ReferenceCache:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return ReferenceCache(tmp_path_factory.mktemp("qwen3-l3"))
