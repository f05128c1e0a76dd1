"""Tiny ``gemma3_text`` configs for the L3 parity fixtures (hub-style config.json).

Both have two sliding layers per full one and a window (8) shorter than the 24-token
prompt, 4 query heads on 2 KV heads and ``head_dim`` 16 ≠ 32 / 4. Together they cover:
the two layer-pattern keys (``sliding_window_pattern``, ``layer_types``), distinct local
and global rope bases, ``query_pre_attn_scalar`` ≠ ``head_dim``, a tied head with
``final_logit_softcapping``; an untied head with ``attention_bias``, linear
``rope_scaling`` on the global layers and an ``attn_logit_softcapping`` (which HF 5.24's
Gemma 3 ignores, so must the package).
"""

from __future__ import annotations

from typing import Any

COMMON: dict[str, Any] = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.25,
    "sliding_window": 8,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}

SPECS: dict[str, dict[str, Any]] = {
    "gemma3-tied-softcap": {
        **COMMON,
        "num_hidden_layers": 6,
        "sliding_window_pattern": 3,
        "query_pre_attn_scalar": 24,
        "tie_word_embeddings": True,
        "final_logit_softcapping": 3.0,
        # tied, the scaled embedding dominates the last position: small weights keep the
        # 16 greedy steps from repeating one token
        "initializer_range": 0.05,
    },
    "gemma3-untied-scaled": {
        **COMMON,
        "num_hidden_layers": 5,
        "layer_types": [
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "sliding_attention",
        ],
        "query_pre_attn_scalar": 16,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
        "attn_logit_softcapping": 1.0,
    },
}

MAX_PROMPT_ID = 90
"""Prompt ids are drawn from [3, MAX_PROMPT_ID): no pad (0) / eos (1) / bos (2)."""
