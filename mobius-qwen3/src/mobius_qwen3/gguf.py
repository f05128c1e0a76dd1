"""Qwen3 GGUF files (architecture ``qwen3``) read as the HF checkpoint they came from.

llama.cpp's converter writes the config as ``qwen3.*`` metadata keys and renames the
tensors (``blk.{i}.attn_q.weight`` …); it permutes nothing for Qwen (only Llama and
Mistral get the q/k row permutation) and shifts no norm. A tied model has no
``output.weight``. The decoder keys and names are core's kit
(:mod:`mobius.lm.gguf`), mapped as HF's GGUF loader maps them (transformers
``integrations/ggml.py``); Qwen3 adds its q/k norms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius.lm.gguf import LAYER_TENSORS, decoder_config, decoder_tensor_names
from mobius.records import GGUFTranslation

ARCHITECTURE = "qwen3"

QWEN3_LAYER_TENSORS = {
    **LAYER_TENSORS,
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
"""``blk.{i}.<name>.weight`` → ``model.layers.{i}.<HF name>.weight``."""


def translate(
    architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
) -> GGUFTranslation | None:
    """The HF config and tensor names of a ``qwen3`` GGUF file (None for other
    architectures)."""
    if architecture != ARCHITECTURE:
        return None
    config = decoder_config(
        architecture,
        metadata,
        tensors,
        family="Qwen3",
        model_type="qwen3",
        hf_class="Qwen3ForCausalLM",
    )
    return GGUFTranslation(
        config=config, tensors=decoder_tensor_names(tensors, QWEN3_LAYER_TENSORS)
    )
