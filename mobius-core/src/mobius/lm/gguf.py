"""GGUF files of Llama-shaped decoder LMs read as their HF checkpoints (the kit's part of
``mobius_gguf_translation``).

llama.cpp's ``convert_hf_to_gguf.py`` writes a decoder's config as ``<arch>.*`` metadata
keys and renames its tensors (``token_embd``, ``blk.{i}.attn_q`` …); HF transformers'
GGUF loader (``integrations/ggml.py``) maps them back. What every decoder family shares
lives here, once: :func:`decoder_config` (the keys below, rope base and scaling, the
vocabulary from the metadata, a tied head when ``output.weight`` is absent) and
:func:`decoder_tensor_names` (the names, with the transforms a family asks for per
tensor kind, e.g. :func:`mobius.checkpoint.gguf.unpermute_rows` for Llama's q and k).
A family adds its own keys and tensors (Qwen3's q/k norms).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mobius.errors import CheckpointError
from mobius.records import GGUFTensor

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
"""``<arch>.<key>`` → HF config key (copied as they are)."""

REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")

ROPE_TYPES = {"linear": "linear", "yarn": "yarn"}
"""``<arch>.rope.scaling.type`` → HF ``rope_type`` (``none``: no scaling)."""

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
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""``blk.{i}.<name>.weight`` → ``model.layers.{i}.<HF name>.weight`` (Llama's layer)."""


def decoder_config(
    architecture: str,
    metadata: Mapping[str, Any],
    tensors: Mapping[str, tuple[int, ...]],
    *,
    family: str,
    model_type: str,
    hf_class: str,
) -> dict[str, Any]:
    """The HF ``config.json`` object of a decoder GGUF file of ``architecture``
    (CheckpointError when a key every decoder needs is missing or the rope scaling is
    one this reading does not know)."""
    missing = [f"{architecture}.{k}" for k in REQUIRED if f"{architecture}.{k}" not in metadata]
    if missing:
        raise CheckpointError(
            f"the {family} GGUF file has no {', '.join(missing)}",
            where="GGUF metadata",
            fix="convert the model again with llama.cpp's convert_hf_to_gguf.py",
        )
    config: dict[str, Any] = {"model_type": model_type, "architectures": [hf_class]}
    for key, hf in CONFIG_KEYS.items():
        if f"{architecture}.{key}" in metadata:
            config[hf] = metadata[f"{architecture}.{key}"]
    rope = _rope(architecture, metadata, family)
    if rope is not None:
        config["rope_parameters"] = rope
    vocab = metadata.get(f"{architecture}.vocab_size")
    if vocab is None and isinstance(metadata.get("tokenizer.ggml.tokens"), list):
        vocab = len(metadata["tokenizer.ggml.tokens"])
    if vocab is None and "token_embd.weight" in tensors:
        vocab = tensors["token_embd.weight"][0]
    if vocab is not None:
        config["vocab_size"] = vocab
    config["tie_word_embeddings"] = "output.weight" not in tensors
    return config


def _rope(architecture: str, metadata: Mapping[str, Any], family: str) -> dict[str, Any] | None:
    theta = metadata.get(f"{architecture}.rope.freq_base")
    kind = metadata.get(f"{architecture}.rope.scaling.type", "none")
    if kind == "none":
        return None if theta is None else {"rope_theta": theta, "rope_type": "default"}
    if kind not in ROPE_TYPES:
        raise CheckpointError(
            f"the {family} GGUF file's rope scaling {kind!r} is not one mobius reads "
            f"(known: none, {', '.join(ROPE_TYPES)})",
            where=f"GGUF metadata {architecture}.rope.scaling.type",
            fix="build the model from its HF checkpoint instead",
        )
    rope: dict[str, Any] = {"rope_type": ROPE_TYPES[kind]}
    if theta is not None:
        rope["rope_theta"] = theta
    factor = metadata.get(f"{architecture}.rope.scaling.factor")
    if factor is not None:
        rope["factor"] = factor
    original = metadata.get(f"{architecture}.rope.scaling.original_context_length")
    if original is not None:
        rope["original_max_position_embeddings"] = original
    return rope


def decoder_tensor_names(
    tensors: Mapping[str, tuple[int, ...]],
    layer_tensors: Mapping[str, str] = LAYER_TENSORS,
    transforms: Callable[[str], tuple[Any, ...]] | None = None,
) -> dict[str, str | GGUFTensor]:
    """Every tensor of the file the layout knows → its HF name (a
    :class:`~mobius.records.GGUFTensor` when ``transforms(gguf_kind)`` asks for some,
    ``gguf_kind`` being ``attn_q``, ``token_embd`` …). Tensors left out are refused by
    core's opener, named."""
    out: dict[str, str | GGUFTensor] = {}
    for name in tensors:
        found = _hf_name(name, layer_tensors)
        if found is None:
            continue
        kind, hf = found
        steps = transforms(kind) if transforms is not None else ()
        out[name] = GGUFTensor(hf, tuple(steps)) if steps else hf
    return out


def _hf_name(name: str, layer_tensors: Mapping[str, str]) -> tuple[str, str] | None:
    if name in GLOBAL_TENSORS:
        return name.split(".")[0], GLOBAL_TENSORS[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] == "weight":
        layer = layer_tensors.get(parts[2])
        if layer is not None:
            return parts[2], f"model.layers.{int(parts[1])}.{layer}.weight"
    return None
