"""The example family of docs/writing-a-plugin.md builds and runs, end to end.

The example distribution (examples/mobius-example-mlp) is not installed: its plugin
module is imported from the source tree and handed to ``PluginHost.from_plugins``,
so this test checks exactly the code the doc walks through. It writes a tiny
safetensors checkpoint, builds it with mobius, runs the package with onnxruntime
and compares the logits with numpy.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from safetensors.numpy import save_file

from mobius.errors import ConfigError, MobiusError
from mobius.plugins import PluginHost

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mobius-example-mlp"
SIZES = {"in_features": 4, "hidden_size": 8, "num_labels": 3}


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch):
    """The example's plugin module, imported from examples/ (not installed)."""
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    for name in [m for m in sys.modules if m.startswith("mobius_example_mlp")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("mobius_example_mlp.plugin")


@pytest.fixture
def host(plugin) -> PluginHost:
    return PluginHost.from_plugins(
        {"tinymlp": plugin}, distributions={"tinymlp": ("mobius-example-mlp", "0.1.0")}
    )


def _checkpoint(folder: Path, config: dict | None = None) -> dict[str, np.ndarray]:
    """A tinymlp checkpoint in PyTorch ``nn.Linear`` layout ([out, in])."""
    rng = np.random.default_rng(7)
    i, h, n = SIZES["in_features"], SIZES["hidden_size"], SIZES["num_labels"]
    tensors = {
        "fc1.weight": rng.standard_normal((h, i)).astype(np.float32),
        "fc1.bias": rng.standard_normal(h).astype(np.float32),
        "fc2.weight": rng.standard_normal((n, h)).astype(np.float32),
        "fc2.bias": rng.standard_normal(n).astype(np.float32),
    }
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config if config is not None else {"model_type": "tinymlp", **SIZES}
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    save_file(tensors, str(folder / "model.safetensors"))
    return tensors


def _reference(t: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    hidden = np.maximum(x @ t["fc1.weight"].T + t["fc1.bias"], 0.0)
    return hidden @ t["fc2.weight"].T + t["fc2.bias"]


def _build(*args, **kwargs):
    from mobius.builder import build

    return build(*args, **kwargs)


def test_example_declares_its_entry_point() -> None:
    """The doc tells users to copy this pyproject: it must name the real plugin module."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["mobius"] == {"tinymlp": "mobius_example_mlp.plugin"}
    assert any(dep.startswith("mobius-core") for dep in project["dependencies"])
    assert (EXAMPLE / "src" / "mobius_example_mlp" / "plugin.py").is_file()


def test_host_registers_the_example(host: PluginHost) -> None:
    assert host.owner("tinymlp") == "tinymlp"
    (record,) = [r for r in host.records() if r.name == "tinymlp"]
    assert record.status == "ok"
    assert record.model_types == ("tinymlp",)
    assert record.distribution == "mobius-example-mlp"


def test_build_and_run_matches_numpy(tmp_path: Path, host: PluginHost) -> None:
    tensors = _checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out"
    result = _build(str(tmp_path / "ckpt"), str(out), host=host)

    assert result.model_type == "tinymlp"
    assert set(result.components) == {"model"}
    assert result.n_tensors == 4
    assert result.unused == ()

    from mobius.package import read_package

    package = read_package(out)
    assert package.manifest["model_type"] == "tinymlp"
    assert package.contract.outputs == ("model.logits",)
    assert package.contract.component("model").inputs[0].name == "features"

    session = ort.InferenceSession(
        str(package.components["model"]), providers=["CPUExecutionProvider"]
    )
    x = np.random.default_rng(1).standard_normal((5, SIZES["in_features"])).astype(np.float32)
    (logits,) = session.run(["logits"], {"features": x})
    assert logits.shape == (5, SIZES["num_labels"])
    np.testing.assert_allclose(logits, _reference(tensors, x), rtol=1e-5, atol=1e-5)


def test_bad_config_is_a_user_error(tmp_path: Path, host: PluginHost) -> None:
    _checkpoint(tmp_path / "ckpt", {"model_type": "tinymlp", **SIZES, "hidden_size": 0})
    with pytest.raises(ConfigError, match="hidden_size"):
        _build(str(tmp_path / "ckpt"), str(tmp_path / "out"), host=host)
    assert not (tmp_path / "out").exists()


def test_shape_mismatch_fails_the_build(tmp_path: Path, host: PluginHost) -> None:
    """A checkpoint whose tensors disagree with config.json never becomes a package."""
    _checkpoint(tmp_path / "ckpt", {"model_type": "tinymlp", **SIZES, "hidden_size": 16})
    with pytest.raises(MobiusError, match="fc1"):
        _build(str(tmp_path / "ckpt"), str(tmp_path / "out"), host=host)
    assert not (tmp_path / "out").exists()
