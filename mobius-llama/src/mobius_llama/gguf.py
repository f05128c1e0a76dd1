"""Llama GGUF files (architecture ``llama``) read as the HF checkpoint they came from.

llama.cpp's converter writes Llama 2 / 3, SmolLM, TinyLlama and Mistral 7B all as
architecture ``llama`` (``llama.*`` metadata keys; gguf-py has no plain ``mistral``
architecture), renames the tensors and permutes the rows of every q and k projection
for its rope layout (``n_head`` = attention heads for q, KV heads for k): undone here
with core's :func:`mobius.checkpoint.gguf.unpermute_rows`. Config keys and names are
core's decoder kit (:mod:`mobius.lm.gguf`), as HF's GGUF loader maps them
(transformers ``integrations/ggml.py``).

Refused with a one-line error (core's opener names the tensor): ``rope_freqs.weight``,
the precomputed Llama 3.1 rope factors (the ``llama3`` rope parameters are not in the
metadata), and q/k/v/o or MLP biases (none of the checkpoints llama.cpp converts as
``llama`` has them). Mistral files are read as Llama (full attention): the metadata
records no sliding window, and a window of 4096 is the same model up to 4096 tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius.checkpoint.gguf import unpermute_rows
from mobius.errors import CheckpointError
from mobius.lm.gguf import decoder_config, decoder_tensor_names
from mobius.records import GGUFTranslation

ARCHITECTURE = "llama"


def translate(
    architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
) -> GGUFTranslation | None:
    """The HF config and tensor names of a ``llama`` GGUF file (None for other
    architectures)."""
    if architecture != ARCHITECTURE:
        return None
    config = decoder_config(
        architecture,
        metadata,
        tensors,
        family="Llama",
        model_type="llama",
        hf_class="LlamaForCausalLM",
    )
    dims = metadata.get(f"{ARCHITECTURE}.rope.dimension_count")
    if dims is not None:  # HF reads it as head_dim for Llama (all of a head rotates)
        config.setdefault("head_dim", dims)
    if "rope_freqs.weight" in tensors:
        raise CheckpointError(
            "the Llama GGUF file holds rope_freqs.weight (Llama 3.1 rope factors), whose "
            "llama3 rope parameters mobius cannot read back from a GGUF file",
            where="GGUF tensor rope_freqs.weight",
            fix="build the model from its HF checkpoint instead",
        )
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    permuted = {"attn_q": (unpermute_rows(heads),), "attn_k": (unpermute_rows(kv_heads),)}
    names = decoder_tensor_names(tensors, transforms=lambda kind: permuted.get(kind, ()))
    return GGUFTranslation(config=config, tensors=names)
