"""Gemma 3 GGUF files (architecture ``gemma3``) read as the ``gemma3_text`` checkpoint
they came from.

llama.cpp's converter writes the config as ``gemma3.*`` metadata keys, renames the
tensors (``blk.{i}.attn_q.weight`` …), stores every RMSNorm weight as HF's ``w + 1``
(llama.cpp multiplies by the weight itself; undone here with ``add_constant(-1.0)``),
may cut ``token_embd`` to the tokenizer's vocabulary (padded back with zero rows) and
writes no ``output.weight`` (the head is tied). It permutes no q/k rows.

What the metadata does not hold comes from the architecture, as llama.cpp's runtime
and HF 5.24's GGUF loader (transformers ``integrations/ggml.py``,
``modeling_gguf_pytorch_utils.py``) take it:

- the layer pattern: every 6th layer is global, the others slide (llama.cpp's
  ``set_swa_pattern(6)``, ``Gemma3TextConfig``'s default); a file that carries
  ``gemma3.attention.sliding_window_pattern`` (gguf-py's key: a period, or one bool per
  layer, true = sliding) is read as it says;
- the sliding layers' rope base 10,000 (only the global ``rope.freq_base`` is stored);
- ``query_pre_attn_scalar``: the head dim (llama.cpp's attention scale
  ``1/sqrt(key_length)``; HF's loader leaves ``Gemma3TextConfig``'s 256, the same for
  every released size but 27B), and ``hidden size / heads`` for the 62-layer 27B, as
  llama.cpp does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius.errors import CheckpointError
from mobius.lm import gguf as lm_gguf
from mobius.records import GGUFTensor, GGUFTranslation

ARCHITECTURE = "gemma3"

CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.sliding_window": "sliding_window",
    "context_length": "max_position_embeddings",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "final_logit_softcapping": "final_logit_softcapping",
}
"""``gemma3.<key>`` → HF config key (copied as they are)."""

REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")

PATTERN = 6
"""Every 6th layer is global (llama.cpp and ``Gemma3TextConfig``)."""
LOCAL_THETA, GLOBAL_THETA = 10_000.0, 1_000_000.0
LAYERS_27B = 62
"""llama.cpp's Gemma 3 27B (scaled by ``hidden / heads``, not the head dim)."""

LAYER_TENSORS = {
    **lm_gguf.LAYER_TENSORS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
"""Core's Llama-shaped layer names, with Gemma 3's four sandwich norms."""


def translate(
    architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
) -> GGUFTranslation | None:
    """The HF config and tensors of a ``gemma3`` GGUF file (None for other
    architectures)."""
    if architecture != ARCHITECTURE:
        return None
    from mobius.checkpoint.gguf import add_constant, pad_rows

    missing = [k for k in REQUIRED if _key(k) not in metadata]
    if missing:
        raise CheckpointError(
            f"the Gemma 3 GGUF file has no {', '.join(_key(k) for k in missing)}",
            where="GGUF metadata",
            fix="convert the model again with llama.cpp's convert_hf_to_gguf.py",
        )
    config: dict[str, Any] = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}
    for key, hf in CONFIG_KEYS.items():
        if _key(key) in metadata:
            config[hf] = metadata[_key(key)]
    layers = config["num_hidden_layers"]
    config["layer_types"] = _layer_types(metadata, layers)
    config["rope_parameters"] = {
        "full_attention": {
            "rope_type": "default",
            "rope_theta": float(metadata.get(_key("rope.freq_base"), GLOBAL_THETA)),
        },
        "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_THETA},
    }
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    config["head_dim"] = head_dim
    config["query_pre_attn_scalar"] = (
        config["hidden_size"] // heads if layers == LAYERS_27B else head_dim
    )
    rows = tensors.get("token_embd.weight", (0,))[0]
    vocab = metadata.get(_key("vocab_size"))
    if vocab is None and isinstance(metadata.get("tokenizer.ggml.tokens"), list):
        vocab = len(metadata["tokenizer.ggml.tokens"])
    vocab = max(int(vocab or 0), rows)
    config["vocab_size"] = vocab
    config["tie_word_embeddings"] = "output.weight" not in tensors
    names: dict[str, str | GGUFTensor] = {}
    for name in tensors:
        hf = hf_name(name)
        if hf is None:
            continue  # refused by the opener, which names it
        if name.endswith("norm.weight"):
            names[name] = GGUFTensor(hf, (add_constant(-1.0),))
        elif name == "token_embd.weight" and rows < vocab:
            names[name] = GGUFTensor(hf, (pad_rows(vocab),))
        else:
            names[name] = hf
    return GGUFTranslation(config=config, tensors=names)


def _key(name: str) -> str:
    return f"{ARCHITECTURE}.{name}"


def _layer_types(metadata: Mapping[str, Any], layers: int) -> list[str]:
    """Sliding / full per layer: the file's ``attention.sliding_window_pattern`` (a
    period or one bool per layer, true = sliding), else every 6th layer global."""
    pattern = metadata.get(_key("attention.sliding_window_pattern"), PATTERN)
    if isinstance(pattern, list):
        if len(pattern) != layers or not all(isinstance(p, bool) for p in pattern):
            raise CheckpointError(
                f"{_key('attention.sliding_window_pattern')} has {len(pattern)} entries for "
                f"{layers} layers (one bool per layer expected)",
                where="GGUF metadata",
                fix="convert the model again with llama.cpp's convert_hf_to_gguf.py",
            )
        sliding = list(pattern)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 1:
        sliding = [(i + 1) % pattern != 0 for i in range(layers)]
    else:
        raise CheckpointError(
            f"{_key('attention.sliding_window_pattern')} is {pattern!r}, not a period or "
            "one bool per layer",
            where="GGUF metadata",
            fix="convert the model again with llama.cpp's convert_hf_to_gguf.py",
        )
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def hf_name(name: str) -> str | None:
    """The HF weight name of GGUF tensor ``name``; None when it is not a Gemma 3 tensor
    (left out of the translation, so the opener refuses the file, naming it)."""
    return lm_gguf.hf_tensor_name(name, LAYER_TENSORS)
