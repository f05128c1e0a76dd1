"""mobius_testing.lm_parity's own rules (the HF side runs in the families' parity envs)."""

from __future__ import annotations

import numpy as np
import pytest

from mobius_testing import lm_parity as lp


def test_parity_ids_are_seeded_and_in_range():
    a, b = lp.parity_ids(20), lp.parity_ids(20)
    assert a.shape == (1, lp.PREFILL + lp.DECODE) and a.dtype == np.int64
    assert np.array_equal(a, b) and a.min() >= 3 and a.max() < 20
    assert not np.array_equal(a, lp.parity_ids(20, seed=lp.SEED + 1))


def test_top1_counts_near_ties_only_within_the_tie():
    ref = np.array([[[0.0, 1.0, 0.99], [2.0, 0.0, 0.0]]])
    got = np.array([[[0.0, 0.5, 0.9], [2.0, 0.0, 0.0]]])  # first row picks the runner-up
    assert lp.top1(ref, got) == (0.5, 0.5)
    assert lp.top1(ref, got, tie=0.02) == (0.5, 1.0)
    assert lp.top1(ref, got, tie=0.001) == (0.5, 0.5)


def test_attention_kind_per_target_and_dtype():
    assert lp.expected_attention("default", "f16") == "Attention"
    assert lp.expected_attention("cpu", "f32") == "GroupQueryAttention"
    assert lp.expected_attention("cuda", "f32") == "Attention"
    assert lp.expected_attention("cpu", "bf16") == "Attention"


def test_graph_counts_and_kv_geometry():
    # the decoder kit is mobius-core >= 0.1.2 (the compat corefloor row has 0.1.1)
    pytest.importorskip("mobius.lm.decoder")
    from mobius.lm.config import FULL, DecoderConfig, read_decoder
    from mobius.lm.decoder import build_decoder

    defaults = {
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 12,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "tie_word_embeddings": True,
    }
    fields = read_decoder("toy", {}, "config.json", family="Toy", defaults=defaults)
    cfg = DecoderConfig(**fields, layer_types=(FULL, FULL), sliding_window=None)
    model = build_decoder(cfg, "f32", family="toy")
    assert lp.kv_geometry(model) == [[1, 4], [1, 4]]
    per_layer = 8 * 8 * 2 + 8 * 4 * 2 + 3 * 8 * 12 + 2 * 8  # q, o; k, v; MLP; two norms
    assert lp.graph_parameters(model) == 10 * 8 + 8 + 2 * per_layer  # tied head counted once
