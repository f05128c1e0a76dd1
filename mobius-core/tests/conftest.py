"""Shared fixtures of mobius-core's tests: fake entry points, a tiny checkpoint, hosts.

Entry points are faked by monkeypatching :func:`mobius.plugins.list_entry_points`
with :class:`FakeEntryPoint` objects whose ``dist`` carries made-up distribution
metadata (name, version, Requires-Dist), so loading, isolation and
compatibility checks run through the real code path without installing anything.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mobius.plugins
from mobius.plugins import PluginHost

TESTS = Path(__file__).parent


@dataclass
class FakeDist:
    name: str
    version: str = "0.1.0"
    requires: list[str] = field(default_factory=lambda: ["mobius-core>=0.1,<0.2"])

    @property
    def metadata(self) -> dict[str, str]:
        return {"Name": self.name}


@dataclass
class FakeEntryPoint:
    """Quacks like importlib.metadata.EntryPoint: name, value, dist, load()."""

    name: str
    value: Any  # a module path, or the plugin object itself
    dist: FakeDist | None = None
    group: str = "mobius"

    def load(self) -> Any:
        if isinstance(self.value, str):
            return importlib.import_module(self.value)
        return self.value


def ep(name: str, value: Any, dist: str | None = None, **dist_kw: Any) -> FakeEntryPoint:
    """An entry point of distribution ``dist`` (default ``mobius-<name>``)."""
    return FakeEntryPoint(name, value, FakeDist(dist or f"mobius-{name}", **dist_kw))


@pytest.fixture
def entry_points(monkeypatch: pytest.MonkeyPatch) -> Callable[[Sequence[FakeEntryPoint]], None]:
    """Install fake entry points (replacing the real ones) for this test."""
    monkeypatch.delenv("MOBIUS_PLUGINS", raising=False)

    def install(eps: Sequence[FakeEntryPoint]) -> None:
        monkeypatch.setattr(mobius.plugins, "list_entry_points", lambda: list(eps))

    install([])
    return install


@pytest.fixture
def tiny_host(entry_points: Callable[..., None]) -> PluginHost:
    """A host with core's built-ins and the tinytest family plugin (as an entry point)."""
    entry_points([ep("tinytest", "plugins_for_tests.tinytest")])
    return PluginHost.load()


def write_tiny_checkpoint(
    folder: Path,
    *,
    in_features: int = 4,
    out_features: int = 3,
    weight_shape: tuple[int, ...] | None = None,
) -> Path:
    """A tinytest checkpoint: config.json + model.safetensors (proj.weight, an unused tensor)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "tinytest", "in_features": in_features, "out_features": out_features}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    shape = weight_shape or (out_features, in_features)
    rng = np.random.default_rng(0)
    save_file(
        {
            "proj.weight": rng.standard_normal(shape).astype(np.float32),
            "proj.ignored": np.zeros(2, np.float32),
            "extra.unused": np.ones(3, np.float32),
        },
        str(folder / "model.safetensors"),
    )
    return folder


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    return write_tiny_checkpoint(tmp_path / "ckpt")
