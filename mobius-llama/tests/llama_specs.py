"""Tiny Llama / Mistral configs for the L3 parity fixtures (hub-style config.json).

Together they cover: tied and untied heads, ``attention_bias`` and ``mlp_bias``,
``llama3`` rope scaling (positions past ``original_max_position_embeddings``), linear
rope, GQA (4 query heads on 2 KV heads), ``head_dim`` ≠ hidden / heads, and Mistral's
sliding window (8) shorter than the 24-token prompt.
"""

from __future__ import annotations

from typing import Any

COMMON: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.25,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

SPECS: dict[str, dict[str, Any]] = {
    "llama-tied": {
        **COMMON,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tie_word_embeddings": True,
        "rope_theta": 10_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    },
    "llama-untied-bias-llama3": {
        **COMMON,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tie_word_embeddings": False,
        "attention_bias": True,
        "mlp_bias": True,
        "head_dim": 16,
        "rope_theta": 500_000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
    "mistral-window": {
        **COMMON,
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "tie_word_embeddings": False,
        "head_dim": 16,
        "sliding_window": 8,
        "rope_theta": 1_000_000.0,
    },
}

MAX_PROMPT_ID = 90
"""Prompt ids are drawn from [3, MAX_PROMPT_ID): no pad (0) / bos (1) / eos (2)."""
