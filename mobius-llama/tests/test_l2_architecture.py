"""L2: the real Llama-3.2-1B / Llama-3.1-8B / Mistral-7B-v0.3 configs (testdata/configs)
build graph-only (no weights, nothing allocated), with parameter counts and KV geometry
equal to what HF transformers 5.24 computes on the meta device (``data/l2_expected.json``,
written by ``data/make_l2_expected.py``; only the ``reference`` test below imports torch).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TESTDATA

from mobius_llama.plugin import FAMILY
from mobius_testing.lm_parity import assert_graph_only, hf_meta_counts

pytestmark = pytest.mark.l2

CONFIGS = TESTDATA / "configs"
EXPECTED = json.loads((Path(__file__).parent / "data" / "l2_expected.json").read_text())


@pytest.mark.parametrize("target", ["default", "cuda"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_full_size_graph_only(name, target):
    assert_graph_only(FAMILY, CONFIGS / name, target, EXPECTED[name])


def test_real_configs_read_as_published():
    small = FAMILY.mobius_read_config(
        "llama", json.loads((CONFIGS / "Llama-3.2-1B.json").read_text())
    )
    assert small.tie_word_embeddings and small.head_dim == 64
    assert small.rope.rope_type == "llama3" and small.rope.factor == 32.0
    assert small.rope.original_max_position_embeddings == 8192
    mistral = FAMILY.mobius_read_config(
        "mistral", json.loads((CONFIGS / "Mistral-7B-v0.3.json").read_text())
    )
    assert mistral.sliding_window is None and set(mistral.layer_types) == {"full_attention"}
    assert mistral.eos_token_id == (2,) and mistral.vocab_size == 32768


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_expectations_are_hf_counts(name):
    """l2_expected.json is what HF 5.24 counts today (recomputed on the meta device)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert hf_meta_counts(CONFIGS / name) == EXPECTED[name]
