"""The tiny Gemma 4 text configurations the parity tests build (no torch needed).

Each spec is a hub-style text config (``global_head_dim`` /
``num_global_key_value_heads`` at the top, no ``per_layer_config``) plus the model
type the checkpoint is saved as. Sizes are tiny (V 1024, H 64) so a build and an
HF forward take well under a second. Every config sets ``sliding_window`` 8 so the
24-token prompts of the tests cross the window, and sets ``hidden_size_per_layer_input``
and ``global_head_dim`` explicitly so reader defaults cannot hide a bug
(docs/gemma4.md §2.3).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

# The text part of testdata/configs/tiny-*.json (hub style).
_BASE_TEXT: dict[str, Any] = {
    "model_type": "gemma4_text",
    "vocab_size": 1024,
    "vocab_size_per_layer_input": 1024,
    "hidden_size": 64,
    "hidden_size_per_layer_input": 16,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "layer_types": [
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ],
    "sliding_window": 8,
    "num_kv_shared_layers": 2,
    "use_double_wide_mlp": True,
    "attention_k_eq_v": False,
    "enable_moe_block": False,
    "num_experts": None,
    "top_k_experts": None,
    "moe_intermediate_size": None,
    "final_logit_softcapping": 3.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
    "initializer_range": 0.05,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "use_bidirectional_attention": None,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "rope_parameters": {
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
}

# Vision / audio towers of the tiny multimodal fixture; the text build ignores them.
VISION_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "position_embedding_size": 64,
    "standardize": True,
    "use_clipped_linears": True,
    "initializer_range": 0.05,
}
AUDIO_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_audio",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "subsampling_conv_channels": [128, 16],
    "output_proj_dims": 48,
    "use_clipped_linears": True,
    "initializer_range": 0.05,
}
# Multimodal token ids of the tiny fixture (inside V = 1024); prompts avoid them.
MM_TOKEN_IDS: dict[str, int] = {
    "image_token_id": 1000,
    "boi_token_id": 1001,
    "eoi_token_id": 1002,
    "audio_token_id": 1003,
    "boa_token_id": 1004,
    "eoa_token_index": 1005,
    "video_token_id": 1006,
}
MAX_PROMPT_ID = 1000
"""Prompt token ids are drawn from [3, MAX_PROMPT_ID): no specials, no placeholders."""


@dataclass(frozen=True)
class TextSpec:
    """One tiny text model: its hub-style text config and how it is wrapped."""

    name: str
    model_type: str  # "gemma4" (Gemma4ForConditionalGeneration) or "gemma4_text"
    overrides: dict[str, Any] = field(default_factory=dict)
    towers: bool = False  # gemma4 only: include the tiny vision + audio towers
    exercises: str = ""
    audio_tower: bool = True  # with towers: False leaves audio_config null (26B/31B-like)
    vision_overrides: dict[str, Any] = field(default_factory=dict)
    audio_overrides: dict[str, Any] = field(default_factory=dict)

    def text_config(self) -> dict[str, Any]:
        """The hub-style text config (a fresh copy)."""
        cfg = copy.deepcopy(_BASE_TEXT)
        cfg.update(copy.deepcopy(self.overrides))
        return cfg


_KEQV = {
    "num_hidden_layers": 4,
    "layer_types": [
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    ],
    "num_kv_shared_layers": 0,
    "use_double_wide_mlp": False,
    "attention_k_eq_v": True,
    "num_global_key_value_heads": 1,
}

_MOE = {
    **_KEQV,
    "hidden_size_per_layer_input": 0,
    "enable_moe_block": True,
    "num_experts": 4,
    "top_k_experts": 2,
    "moe_intermediate_size": 24,
}

# Two checkpoints identical but for num_experts (8 vs 64, top-2): experts big enough
# (H 128, moe_intermediate 128) that reading all of them shows in decode speed.
_MOE_WIDE = {**_MOE, "hidden_size": 128, "moe_intermediate_size": 128, "top_k_experts": 2}

SPECS: dict[str, TextSpec] = {
    s.name: s
    for s in (
        TextSpec(
            "dense-text",
            "gemma4_text",
            exercises="PLE, KV sharing, double-wide MLP, dual head dim, proportional RoPE, softcap",
        ),
        TextSpec(
            "dense-mm",
            "gemma4",
            towers=True,
            exercises="dense-text inside Gemma4ForConditionalGeneration with vision+audio towers",
        ),
        TextSpec(
            "keqv-text",
            "gemma4_text",
            overrides=_KEQV,
            exercises="attention_k_eq_v with num_global_key_value_heads 1 (≠ sliding kv 2)",
        ),
        TextSpec(
            "bidir-mm",
            "gemma4",
            overrides={**_KEQV, "use_bidirectional_attention": "vision"},
            towers=True,
            audio_tower=False,
            vision_overrides={"standardize": False},
            exercises="dense k_eq_v + vision (no standardize) + 'vision' image-block mask, no audio",
        ),
        TextSpec(
            "moe-text",
            "gemma4_text",
            overrides=_MOE,
            exercises="MoE 4 experts top-2, moe_intermediate 24 ≠ intermediate 128, k_eq_v, no PLE",
        ),
        TextSpec(
            "moe8-text",
            "gemma4_text",
            overrides={**_MOE_WIDE, "num_experts": 8},
            exercises="MoE 8 experts top-2, H 128 (the routed-decode pair, with moe64-text)",
        ),
        TextSpec(
            "moe64-text",
            "gemma4_text",
            overrides={**_MOE_WIDE, "num_experts": 64},
            exercises="moe8-text with 64 experts: decode reads 2 of 64",
        ),
        TextSpec(
            "bidir-moe-mm",
            "gemma4",
            overrides={**_MOE, "use_bidirectional_attention": "vision"},
            towers=True,
            audio_tower=False,
            exercises="26B-A4B-like: MoE + k_eq_v text, vision (clipped, standardize), "
            "'vision' image-block mask, no audio",
        ),
        TextSpec(
            "mm-a8",
            "gemma4",
            towers=True,
            audio_overrides={"num_attention_heads": 8},
            exercises="dense-mm with an 8-head audio tower (head dim 4)",
        ),
    )
}


def hub_style_config(spec: TextSpec) -> dict[str, Any]:
    """The full config.json (hub style) of ``spec``, as the Hub ships it."""
    text = spec.text_config()
    if spec.model_type == "gemma4_text":
        return {"architectures": ["Gemma4ForCausalLM"], **text}
    cfg: dict[str, Any] = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": (
            {**copy.deepcopy(VISION_CONFIG), **spec.vision_overrides} if spec.towers else None
        ),
        "audio_config": (
            {**copy.deepcopy(AUDIO_CONFIG), **spec.audio_overrides}
            if spec.towers and spec.audio_tower
            else None
        ),
        "tie_word_embeddings": True,
        "initializer_range": 0.05,
        **MM_TOKEN_IDS,
    }
    return cfg


def text_part(raw: dict[str, Any]) -> dict[str, Any]:
    """The text config inside a config.json of either model type."""
    return raw["text_config"] if raw.get("model_type") == "gemma4" else raw
