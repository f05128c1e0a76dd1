"""Qwen3 GGUF files (architectures ``qwen3`` and ``qwen3moe``) read as the HF checkpoint
they came from.

llama.cpp writes Qwen3 as a Llama-shaped decoder (:mod:`mobius.lm.gguf`) with q / k
norms; it permutes nothing for Qwen (only Llama and Mistral get the q / k row
permutation) and shifts no norm. ``qwen3moe`` adds, per sparse layer, the router
``ffn_gate_inp`` (HF ``mlp.gate``, ``[E, H]``) and the experts stacked per projection:
``ffn_gate_exps`` / ``ffn_up_exps`` ``[E, I, H]`` and ``ffn_down_exps`` ``[E, H, I]``
(numpy order), read as ``mlp.experts.{gate,up,down}_proj.weight`` (the third expert
layout :mod:`mobius_qwen3.weights` accepts). Its config keys: ``expert_count``,
``expert_used_count`` and ``expert_feed_forward_length``. llama.cpp's qwen3moe graph
always renormalises the top-k weights, so ``norm_topk_prob`` is true (as HF's GGUF
loader sets it); a layer without experts in the file is dense (``mlp_only_layers``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius.errors import CheckpointError
from mobius.lm.gguf import LAYER_TENSORS, decoder_translation, hf_tensor_name
from mobius.records import GGUFTranslation

ARCHITECTURE = "qwen3"
MOE_ARCHITECTURE = "qwen3moe"

MOE_LAYER_TENSORS = {
    **LAYER_TENSORS,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
"""qwen3moe's per-layer names: the dense ones and the router and expert tables."""

MOE_CONFIG_KEYS = {
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
}
"""``qwen3moe.<key>`` → HF ``Qwen3MoeConfig`` key (all required)."""


def translate(
    architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
) -> GGUFTranslation | None:
    """The HF config and tensor names of a ``qwen3`` / ``qwen3moe`` GGUF file (None for
    other architectures)."""
    if architecture == ARCHITECTURE:
        return decoder_translation(
            metadata,
            tensors,
            architecture=ARCHITECTURE,
            model_type="qwen3",
            hf_class="Qwen3ForCausalLM",
            permuted_qk=False,
        )
    if architecture != MOE_ARCHITECTURE:
        return None
    base = decoder_translation(
        metadata,
        tensors,
        architecture=MOE_ARCHITECTURE,
        model_type="qwen3_moe",
        hf_class="Qwen3MoeForCausalLM",
        permuted_qk=False,
    )
    key = f"{MOE_ARCHITECTURE}.{{}}".format
    missing = [key(k) for k in MOE_CONFIG_KEYS if key(k) not in metadata]
    if missing:
        raise CheckpointError(
            f"the qwen3moe GGUF file has no {', '.join(missing)}",
            where="GGUF metadata",
            fix="convert the model again with llama.cpp's convert_hf_to_gguf.py",
        )
    config = dict(base.config)
    config.update({hf: metadata[key(k)] for k, hf in MOE_CONFIG_KEYS.items()})
    layers = int(config["num_hidden_layers"])
    config["norm_topk_prob"] = True
    config["decoder_sparse_step"] = 1
    config["mlp_only_layers"] = [
        i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensors
    ]
    names = dict(base.tensors)  # the dense names; the router and experts added here
    for name in tensors:
        if name not in names and (hf := hf_tensor_name(name, MOE_LAYER_TENSORS)) is not None:
            names[name] = hf
    return GGUFTranslation(config=config, tensors=names)
