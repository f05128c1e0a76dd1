"""Llama GGUF files (architecture ``llama``: Llama 2 / 3, SmolLM, TinyLlama …) read as the
HF checkpoint they came from.

llama.cpp writes them as a Llama-shaped decoder (:mod:`mobius.lm.gguf`) with the q / k
rows permuted for its rope layout, which the translation undoes. Not read yet: Llama 3.1
rope scaling (``llama.rope.scaling.*`` with ``rope_freqs``), and Mistral files (llama.cpp
also writes them as ``llama``; they build as ``llama`` without the sliding window).
"""

from __future__ import annotations

from mobius.lm.gguf import translator

ARCHITECTURE = "llama"

translate = translator(
    ARCHITECTURE, model_type="llama", hf_class="LlamaForCausalLM", permuted_qk=True
)
"""The HF config and tensor names of a ``llama`` GGUF file (None for others)."""
