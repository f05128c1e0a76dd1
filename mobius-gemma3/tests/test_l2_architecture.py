"""L2: the real Gemma-3-270m / Gemma-3-1b-it configs (testdata/configs) build graph-only
(no weights, nothing allocated), with parameter counts and KV geometry equal to what HF
transformers 5.24 computes on the meta device (``data/l2_expected.json``, written by
``data/make_l2_expected.py``; only the ``reference`` test below imports torch).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TESTDATA

from mobius_gemma3.plugin import FAMILY
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
        "gemma3_text", json.loads((CONFIGS / "gemma-3-270m.json").read_text())
    )
    one_b = FAMILY.mobius_read_config(
        "gemma3_text", json.loads((CONFIGS / "gemma-3-1b-it.json").read_text())
    )
    for cfg in (small, one_b):
        assert cfg.tie_word_embeddings and cfg.head_dim == 256 and cfg.sliding_window == 512
        assert (cfg.rope.rope_theta, cfg.local_rope.rope_theta) == (1e6, 1e4)
        assert cfg.rope.rope_type == "default" and cfg.query_pre_attn_scalar == 256
        full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
        assert full == list(range(5, cfg.num_hidden_layers, 6))
    assert small.eos_token_id == (1,) and one_b.eos_token_id == (1, 106)


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_expectations_are_hf_counts(name):
    """l2_expected.json is what HF 5.24 counts today (recomputed on the meta device)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert hf_meta_counts(CONFIGS / name) == EXPECTED[name]
