"""Tiny Qwen3 / Qwen3-MoE configs for the L3 parity fixtures (hub-style config.json).

Each spec is written in the shape of the released Hub checkpoints (top-level
``rope_theta`` and ``rope_scaling``, ``num_experts``); ``save_pretrained`` of HF 5.24
writes the other shape (``rope_parameters``, ``num_local_experts``). Together the three
cover: tied and untied heads, attention biases, sliding layers (window 8, prompt of 24),
yarn RoPE with positions past ``original_max_position_embeddings``, GQA (4 query heads
on 2 KV heads), and MoE with a dense layer (``mlp_only_layers``) and ``norm_topk_prob``.
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
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.25,
    "bos_token_id": None,
    "eos_token_id": 1,
    "pad_token_id": 0,
}

SPECS: dict[str, dict[str, Any]] = {
    "dense-tied": {
        **COMMON,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "tie_word_embeddings": True,
        "rope_theta": 1_000_000.0,
    },
    "dense-untied": {
        **COMMON,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "tie_word_embeddings": False,
        "attention_bias": True,
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 1,
        "rope_theta": 10_000.0,
        "rope_scaling": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16},
    },
    "moe": {
        **COMMON,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "tie_word_embeddings": False,
        "rope_theta": 1_000_000.0,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0],
    },
}

MAX_PROMPT_ID = 90
"""Prompt ids are drawn from [3, MAX_PROMPT_ID): no pad (0) / eos (1)."""
