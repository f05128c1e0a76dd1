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
from pathlib import Path

import pytest
from conftest import TESTDATA

from mobius_qwen3.plugin import FAMILY
from mobius_testing.lm_parity import assert_graph_only, hf_meta_counts

pytestmark = pytest.mark.l2

CONFIGS = TESTDATA / "configs"
EXPECTED = json.loads((Path(__file__).parent / "data" / "l2_expected.json").read_text())


@pytest.mark.parametrize("target", ["default", "cuda"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_full_size_graph_only(name, target):
    assert_graph_only(FAMILY, CONFIGS / name, target, EXPECTED[name])


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_expectations_are_hf_counts(name):
    """l2_expected.json is what HF 5.24 counts today (recomputed on the meta device)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert hf_meta_counts(CONFIGS / name) == EXPECTED[name]
