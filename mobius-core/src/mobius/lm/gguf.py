"""GGUF files of Llama-shaped decoders, for the families of :mod:`mobius.lm`.

llama.cpp's converter writes every Llama-shaped decoder the same way: the config as
``<arch>.*`` metadata keys, the tensors under gguf-py's names (``token_embd``,
``blk.{i}.attn_q`` …, ``output`` absent when the head is tied). A family names its
architecture, its HF ``model_type`` / class, and whether llama.cpp permuted the q / k
rows for its rope layout (Llama and Mistral: yes; Qwen: no); this module gives the
:class:`~mobius.records.GGUFTranslation` (``mobius_gguf_translation``), mapped as HF's
GGUF loader maps these keys (transformers ``integrations/ggml.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mobius.errors import CheckpointError
from mobius.records import GGUFTensor, GGUFTranslation

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
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""``blk.{i}.<name>.{weight,bias}`` → ``model.layers.{i}.<HF name>.{weight,bias}``."""


def decoder_translation(
    metadata: Mapping[str, Any],
    tensors: Mapping[str, tuple[int, ...]],
    *,
    architecture: str,
    model_type: str,
    hf_class: str,
    permuted_qk: bool,
) -> GGUFTranslation:
    """The HF config and tensor names of a Llama-shaped decoder's GGUF file.

    ``permuted_qk``: llama.cpp stored q / k rows permuted (Llama, Mistral); the
    translation undoes it (:func:`mobius.checkpoint.gguf.unpermute_rows`, with the
    attention heads for q and the KV heads for k). Tensors outside these names are left
    out, so the opener refuses the file naming them.
    """
    key = f"{architecture}.{{}}".format
    missing = [key(k) for k in REQUIRED if key(k) not in metadata]
    if missing:
        raise CheckpointError(
            f"the {architecture} GGUF file has no {', '.join(missing)}",
            where="GGUF metadata",
            fix="convert the model again with llama.cpp's convert_hf_to_gguf.py",
        )
    config: dict[str, Any] = {"model_type": model_type, "architectures": [hf_class]}
    for name, hf in CONFIG_KEYS.items():
        if key(name) in metadata:
            config[hf] = metadata[key(name)]
    rope = _rope(architecture, metadata)
    if rope is not None:
        config["rope_parameters"] = rope
    vocab = metadata.get(key("vocab_size"))
    if vocab is None and isinstance(metadata.get("tokenizer.ggml.tokens"), list):
        vocab = len(metadata["tokenizer.ggml.tokens"])
    if vocab is None and "token_embd.weight" in tensors:
        vocab = tensors["token_embd.weight"][0]
    if vocab is not None:
        config["vocab_size"] = vocab
    config["tie_word_embeddings"] = "output.weight" not in tensors
    permute = {}
    if permuted_qk:
        from mobius.checkpoint.gguf import unpermute_rows

        heads = int(config["num_attention_heads"])
        permute = {
            "attn_q": (unpermute_rows(heads),),
            "attn_k": (unpermute_rows(int(config.get("num_key_value_heads", heads))),),
        }
    names: dict[str, str | GGUFTensor] = {}
    for name in tensors:
        hf_name = hf_tensor_name(name)
        if hf_name is None:
            continue
        layer_part = name.split(".")[2] if name.startswith("blk.") else ""
        transforms = permute.get(layer_part, ()) if name.endswith(".weight") else ()
        names[name] = GGUFTensor(hf_name, transforms) if transforms else hf_name
    return GGUFTranslation(config=config, tensors=names)


def _rope(architecture: str, metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """HF ``rope_parameters`` from ``<arch>.rope.freq_base`` and ``<arch>.rope.scaling.*``."""
    theta = metadata.get(f"{architecture}.rope.freq_base")
    kind = metadata.get(f"{architecture}.rope.scaling.type", "none")
    if kind == "none":
        return None if theta is None else {"rope_theta": theta, "rope_type": "default"}
    if kind not in ROPE_TYPES:
        raise CheckpointError(
            f"the {architecture} GGUF file's rope scaling {kind!r} is not one mobius reads "
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


def hf_tensor_name(name: str, layer_tensors: Mapping[str, str] = LAYER_TENSORS) -> str | None:
    """The HF weight name of GGUF tensor ``name`` (``token_embd.weight``,
    ``blk.{i}.<part>.{weight,bias}`` with ``part`` in ``layer_tensors``); None when it is
    none of these (left out of a translation, so the opener refuses the file, naming it)."""
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit():
        layer = layer_tensors.get(parts[2])
        if layer is not None and parts[3] in ("weight", "bias"):
            return f"model.layers.{int(parts[1])}.{layer}.{parts[3]}"
    return None


def translator(
    architecture: str, *, model_type: str, hf_class: str, permuted_qk: bool
) -> Callable[[str, Mapping[str, Any], Mapping[str, tuple[int, ...]]], GGUFTranslation | None]:
    """The ``DecoderFamily(gguf=...)`` function of one llama.cpp ``architecture``: its files
    through :func:`decoder_translation`, None for any other architecture."""

    def translate(
        arch: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
    ) -> GGUFTranslation | None:
        if arch != architecture:
            return None
        return decoder_translation(
            metadata,
            tensors,
            architecture=architecture,
            model_type=model_type,
            hf_class=hf_class,
            permuted_qk=permuted_qk,
        )

    return translate
