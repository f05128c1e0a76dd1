"""Qwen3 GGUF files (architecture ``qwen3``) read as the HF checkpoint they came from.

llama.cpp writes Qwen3 as a Llama-shaped decoder (:mod:`mobius.lm.gguf`) with q / k
norms; it permutes nothing for Qwen (only Llama and Mistral get the q / k row
permutation) and shifts no norm. ``qwen3moe`` files are not read yet.
"""

from __future__ import annotations

from mobius.lm.gguf import translator

ARCHITECTURE = "qwen3"

translate = translator(
    ARCHITECTURE, model_type="qwen3", hf_class="Qwen3ForCausalLM", permuted_qk=False
)
"""The HF config and tensor names of a ``qwen3`` GGUF file (None for others)."""
