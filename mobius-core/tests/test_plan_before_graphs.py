"""A checkpoint that cannot match its config is refused before any graph is built.

The family below builds a one-MatMul graph but plans one checkpoint tensor per
layer of ``num_layers``; ``mobius_build_component`` records every call. A config
that claims 4,096 layers over a 2-layer checkpoint (the crafted-input finding:
refused only after minutes of graph building) must fail from the safetensors
headers alone, naming the missing tensors, with no graph built and nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from plugins_for_tests import tinytest
from safetensors.numpy import save_file

import mobius
from mobius import hookimpl
from mobius.errors import WeightPlanError
from mobius.plugins import PluginHost
from mobius.records import ModelTypeInfo


class Layered:
    """``model_type: layered``; ``transform`` optionally breaks the plan's one transform."""

    def __init__(self, transform: str = "transpose") -> None:
        self.built: list[str] = []
        self.transform = transform

    @hookimpl
    def mobius_model_types(self) -> list[ModelTypeInfo]:
        return [ModelTypeInfo("layered", tasks=("feature-extraction",))]

    @hookimpl
    def mobius_read_config(self, model_type: str, raw: dict[str, Any]) -> dict[str, Any]:
        return dict(raw)

    @hookimpl
    def mobius_pipeline_contract(self, config: dict[str, Any], options: Any) -> Any:
        return tinytest.mobius_pipeline_contract(tinytest.TinyConfig(4, 3), options)

    @hookimpl
    def mobius_build_component(self, config: dict[str, Any], component: str, options: Any) -> Any:
        self.built.append(component)
        return tinytest.mobius_build_component(tinytest.TinyConfig(4, 3), component, options)

    @hookimpl
    def mobius_weight_plan(
        self, config: dict[str, Any], component: str, checkpoint: Any, options: Any
    ) -> Any:
        from mobius.weights import WeightPlan, ref

        plan = WeightPlan()
        weight = ref("proj.weight")
        plan.add(
            "w", weight.transpose() if self.transform == "transpose" else weight.reshape([5, 5])
        )
        for i in range(config["num_layers"]):
            plan.add(f"layer{i}", ref(f"layers.{i}.weight"))
        return plan


def checkpoint(folder: Path, *, num_layers: int, real_layers: int = 2) -> Path:
    folder.mkdir(parents=True)
    config = {"model_type": "layered", "num_layers": num_layers}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {"proj.weight": np.ones((3, 4), np.float32)}
    tensors |= {f"layers.{i}.weight": np.ones(2, np.float32) for i in range(real_layers)}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_a_config_claiming_4096_layers_is_refused_before_any_graph(tmp_path: Path) -> None:
    family = Layered()
    host = PluginHost.from_plugins({"layered": family})
    source = checkpoint(tmp_path / "ckpt", num_layers=4096)
    out = tmp_path / "out"
    with pytest.raises(WeightPlanError) as info:
        mobius.build(str(source), str(out), host=host)
    what = info.value.what
    assert "found before building any graph" in what
    assert "model: checkpoint tensors missing (4094): layers.10.weight" in what
    assert "and 4074 more" in what
    assert len(what) < 2000  # the names are listed up to a bound, the count always
    assert "number of layers" in info.value.fix
    assert family.built == []
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_transform_that_cannot_apply_is_refused_before_any_graph(tmp_path: Path) -> None:
    family = Layered(transform="reshape")
    host = PluginHost.from_plugins({"layered": family})
    source = checkpoint(tmp_path / "ckpt", num_layers=2)
    with pytest.raises(WeightPlanError) as info:
        mobius.build(str(source), str(tmp_path / "out"), host=host)
    assert "model: initializer 'w':" in info.value.what and "reshape" in info.value.what
    assert family.built == []


def test_a_matching_checkpoint_still_builds(tmp_path: Path) -> None:
    family = Layered()
    host = PluginHost.from_plugins({"layered": family})
    source = checkpoint(tmp_path / "ckpt", num_layers=0)
    result = mobius.build(str(source), str(tmp_path / "out"), host=host)
    assert family.built == ["model"] and result.n_tensors == 1


def test_graph_dependent_problems_are_still_found_by_bind(tmp_path: Path) -> None:
    """Tensors that exist but that the graph has no initializer for: found after building."""
    family = Layered()
    host = PluginHost.from_plugins({"layered": family})
    source = checkpoint(tmp_path / "ckpt", num_layers=2)
    with pytest.raises(WeightPlanError) as info:
        mobius.build(str(source), str(tmp_path / "out"), host=host)
    assert family.built == ["model"]
    assert "plan entry 'layer0' names no initializer of the graph" in info.value.what
