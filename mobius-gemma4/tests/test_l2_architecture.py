"""L2: the full-size Gemma 4 configs (gemma4, and gemma4_unified for the encoder-free 12B)
build graph-only (no weights, nothing allocated) within 60 s; KV geometry and parameter counts equal what HF 5.24 computes on the meta device
(``data/l2_expected.json``, made by ``data/make_l2_expected.py``; this test never imports
torch).

Counting: graph parameters are the non-constant initializers (those without data) of a
component. The split package's decoder holds its own ``lm_head`` copy of ``embed_tokens``,
so the expected decoder count is HF's non-embedding text parameters + V·H; the single
``model`` graph of a text build shares one table (embedding + decoder − V·H).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import onnx_ir as ir
import pytest
from reference.paths import CONFIGS

from mobius.components.experts import decode_weight_bytes, expert_tables
from mobius.records import BuildOptions
from mobius_gemma4.build import build_component
from mobius_gemma4.config import read_config
from mobius_gemma4.plugin import mobius_read_config

pytestmark = pytest.mark.l2

EXPECTED = json.loads((Path(__file__).parent / "data" / "l2_expected.json").read_text())


def _read(name: str):
    """The config of fixture ``name`` read as its own model type (gemma4 or gemma4_unified)."""
    raw = json.loads((CONFIGS / name).read_text())
    assert raw["model_type"] == EXPECTED[name]["model_type"]
    return mobius_read_config(raw["model_type"], raw)


def _params(model: ir.Model) -> int:
    total = 0
    for value in model.graph.initializers.values():
        if value.const_value is None:
            total += math.prod(int(d) for d in value.shape)
    return total


def _kv_geometry(model: ir.Model) -> list[list[int]]:
    dims = {}
    for value in model.graph.inputs:
        if value.name.startswith("past_key_values.") and value.name.endswith(".key"):
            i = int(value.name.split(".")[1])
            dims[i] = [int(value.shape[1]), int(value.shape[3])]
    assert sorted(dims) == list(range(len(dims)))
    return [dims[i] for i in range(len(dims))]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_full_size_encoders_and_contract(name):
    """Vision (all) and audio (E2B/E4B) encoders hold HF's tower + embedder parameters, and
    the contract of the whole package validates against the graphs."""
    from mobius.contract import validate
    from mobius_gemma4.contract import pipeline_contract, text_components

    expected = EXPECTED[name]["encoder_params"]
    config = _read(name)
    options = BuildOptions(dtype="bf16")
    names = text_components(config, options)
    assert [c for c in names if c.endswith("_encoder")] == sorted(expected, reverse=True)
    graphs = {c: build_component(config, c, options) for c in names}
    for comp, count in expected.items():
        assert _params(graphs[comp]) == count, comp
    validate(pipeline_contract(config, options), graphs)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_full_size_split_build(name):
    expected = EXPECTED[name]
    config = _read(name)
    options = BuildOptions(dtype="bf16")
    start = time.perf_counter()
    embedding = build_component(config, "embedding", options)
    decoder = build_component(config, "decoder", options)
    assert time.perf_counter() - start < 60
    assert _kv_geometry(decoder) == expected["cache_geometry"]
    assert len(expected["cache_geometry"]) == expected["num_cache_layers"]
    assert _params(embedding) == expected["embedding_params"]
    assert _params(decoder) == expected["decoder_params"]


def test_text_only_single_graph_shares_the_table():
    name = "gemma-4-E2B-it.json"
    raw = json.loads((CONFIGS / name).read_text())["text_config"]
    config = read_config("gemma4_text", raw)
    model = build_component(config, "model", BuildOptions(dtype="bf16"))
    e = EXPECTED[name]
    tied_table = config.text.vocab_size * config.text.hidden_size
    assert _params(model) == e["embedding_params"] + e["decoder_params"] - tied_table
    assert _kv_geometry(model) == e["cache_geometry"]


def test_moe_decode_reads_top_k_experts():
    """26B-A4B (bf16, graph-only): each layer's gate_up / down tables are read only through
    Gathers of the hit experts, so a decode token reads top_k of num_experts slabs. Prints
    the weight bytes per decode token, routed vs dense (run with ``-s``)."""
    config = _read("gemma-4-26B-A4B-it.json")
    text = config.text
    E, k, L = text.num_experts, text.top_k_experts, text.num_hidden_layers
    decoder = build_component(config, "decoder", BuildOptions(dtype="bf16"))
    tables = expert_tables(decoder.graph)
    assert len(tables) == 2 * L
    expert_bytes = L * E * 3 * text.hidden_size * text.moe_intermediate_size * 2
    assert sum(math.prod(int(d) for d in v.shape) * 2 for v in tables) == expert_bytes
    routed, dense = decode_weight_bytes(decoder.graph, E, k)
    assert dense - routed == expert_bytes - expert_bytes * k // E
    print(
        f"\n[L2] gemma-4-26B-A4B decoder bf16: weight bytes per decode token routed "
        f"{routed / 2**30:.2f} GiB, dense {dense / 2**30:.2f} GiB ({dense / routed:.1f}x); "
        f"experts {expert_bytes * k // E / 2**30:.2f} of {expert_bytes / 2**30:.2f} GiB "
        f"({k} of {E} per layer)"
    )
