"""Llama GGUF files (architecture ``llama``: Llama 2 / 3, SmolLM, TinyLlama …) read as the
HF checkpoint they came from.

llama.cpp writes them as a Llama-shaped decoder (:mod:`mobius.lm.gguf`) with the q / k
rows permuted for its rope layout, which the translation undoes. Not read yet: Llama 3.1
rope scaling (``llama.rope.scaling.*`` with ``rope_freqs``), and Mistral files (llama.cpp
also writes them as ``llama``; they build as ``llama`` without the sliding window).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius.lm.gguf import decoder_translation
from mobius.records import GGUFTranslation

ARCHITECTURE = "llama"


def translate(
    architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
) -> GGUFTranslation | None:
    """The HF config and tensor names of a ``llama`` GGUF file (None for others)."""
    if architecture != ARCHITECTURE:
        return None
    return decoder_translation(
        metadata,
        tensors,
        architecture=ARCHITECTURE,
        model_type="llama",
        hf_class="LlamaForCausalLM",
        permuted_qk=True,
    )
