"""Qwen3 GGUF files (architecture ``qwen3``) read as the HF checkpoint they came from.

llama.cpp writes Qwen3 as a Llama-shaped decoder (:mod:`mobius.lm.gguf`) with q / k
norms; it permutes nothing for Qwen (only Llama and Mistral get the q / k row
permutation) and shifts no norm. ``qwen3moe`` files are not read yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius.lm.gguf import decoder_translation
from mobius.records import GGUFTranslation

ARCHITECTURE = "qwen3"


def translate(
    architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
) -> GGUFTranslation | None:
    """The HF config and tensor names of a ``qwen3`` GGUF file (None for others)."""
    if architecture != ARCHITECTURE:
        return None
    return decoder_translation(
        metadata,
        tensors,
        architecture=ARCHITECTURE,
        model_type="qwen3",
        hf_class="Qwen3ForCausalLM",
        permuted_qk=False,
    )
