"""Qwen3 GGUF files (architecture ``qwen3``) read as the HF checkpoint they came from.

llama.cpp's converter writes the config as ``qwen3.*`` metadata keys and renames the
tensors (``blk.{i}.attn_q.weight`` …); it permutes nothing for Qwen (only Llama and
Mistral get the q/k row permutation) and shifts no norm. A tied model has no
``output.weight``. Mapped as HF's GGUF loader maps them (transformers
``integrations/ggml.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius.errors import CheckpointError
from mobius.records import GGUFTranslation

ARCHITECTURE = "qwen3"

CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "context_length": "max_position_embeddings",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
}
"""``qwen3.<key>`` → HF config key (copied as they are)."""

REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")

GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""``blk.{i}.<name>.weight`` → ``model.layers.{i}.<HF name>.weight``."""


def translate(
    architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
) -> GGUFTranslation | None:
    """The HF config and tensor names of a ``qwen3`` GGUF file (None for other
    architectures)."""
    if architecture != ARCHITECTURE:
        return None
    missing = [k for k in REQUIRED if f"{ARCHITECTURE}.{k}" not in metadata]
    if missing:
        raise CheckpointError(
            f"the Qwen3 GGUF file has no {', '.join(f'{ARCHITECTURE}.{k}' for k in missing)}",
            where="GGUF metadata",
            fix="convert the model again with llama.cpp's convert_hf_to_gguf.py",
        )
    config: dict[str, Any] = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    for key, hf in CONFIG_KEYS.items():
        if f"{ARCHITECTURE}.{key}" in metadata:
            config[hf] = metadata[f"{ARCHITECTURE}.{key}"]
    theta = metadata.get(f"{ARCHITECTURE}.rope.freq_base")
    if theta is not None:
        config["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    vocab = metadata.get(f"{ARCHITECTURE}.vocab_size")
    if vocab is None and isinstance(metadata.get("tokenizer.ggml.tokens"), list):
        vocab = len(metadata["tokenizer.ggml.tokens"])
    if vocab is None and "token_embd.weight" in tensors:
        vocab = tensors["token_embd.weight"][0]
    if vocab is not None:
        config["vocab_size"] = vocab
    config["tie_word_embeddings"] = "output.weight" not in tensors
    names = {n: hf for n in tensors if (hf := hf_name(n)) is not None}  # others: refused
    return GGUFTranslation(config=config, tensors=names)


def hf_name(name: str) -> str | None:
    """The HF weight name of GGUF tensor ``name``; None when it is not a Qwen3 tensor
    (left out of the translation, so the opener refuses the file, naming it)."""
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] == "weight":
        layer = LAYER_TENSORS.get(parts[2])
        if layer is not None:
            return f"model.layers.{int(parts[1])}.{layer}.weight"
    return None
