"""L2: the real Qwen3-0.6B / 8B / 30B-A3B configs (testdata/configs) build graph-only
(no weights, nothing allocated), with parameter counts and KV geometry equal to what HF
transformers 5.24 computes on the meta device (``data/l2_expected.json``, written by
``data/make_l2_expected.py``; only the ``reference`` test below imports torch).

Graph parameters are the initializers without data (architecture constants such as
``rope.inv_freq`` carry theirs). A tied head reuses ``embed_tokens.weight``, so tied and
untied heads both count as HF does.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import onnx_ir as ir
import pytest
from conftest import TESTDATA

from mobius.contract import validate
from mobius.records import BuildOptions
from mobius_qwen3.contract import pipeline_contract
from mobius_qwen3.model import build_model
from mobius_qwen3.plugin import mobius_read_config

pytestmark = pytest.mark.l2

CONFIGS = TESTDATA / "configs"
EXPECTED = json.loads((Path(__file__).parent / "data" / "l2_expected.json").read_text())


def _params(model: ir.Model) -> int:
    return sum(
        math.prod(int(d) for d in v.shape)
        for v in model.graph.initializers.values()
        if v.const_value is None
    )


def _kv_geometry(model: ir.Model) -> list[list[int]]:
    dims = {}
    for value in model.graph.inputs:
        if value.name.startswith("past_key_values.") and value.name.endswith(".key"):
            dims[int(value.name.split(".")[1])] = [int(value.shape[1]), int(value.shape[3])]
    return [dims[i] for i in sorted(dims)]


@pytest.mark.parametrize("target", ["default", "cuda"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_full_size_graph_only(name, target):
    raw = json.loads((CONFIGS / name).read_text())
    config = mobius_read_config(raw["model_type"], raw)
    options = BuildOptions(dtype="bf16", target=target)
    start = time.perf_counter()
    model = build_model(config, options.dtype, options.target)
    seconds = time.perf_counter() - start
    params = _params(model)
    print(f"\n[L2] {name} target={target}: {params:,} parameters, built in {seconds:.1f} s")
    assert seconds < 60
    assert params == EXPECTED[name]["params"]
    assert _kv_geometry(model) == EXPECTED[name]["cache_geometry"]
    validate(pipeline_contract(config, options), {"model": model})


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_expectations_are_hf_counts(name):
    """l2_expected.json is what HF 5.24 counts today (recomputed on the meta device)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "data"))
    from make_l2_expected import hf_expectation

    assert hf_expectation(name) == EXPECTED[name]
