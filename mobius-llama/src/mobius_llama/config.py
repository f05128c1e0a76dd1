"""Typed Llama / Mistral configs read from raw ``config.json`` (never transformers).

Everything but the window comes from :func:`mobius.lm.config.read_decoder`, with the
defaults of HF transformers 5.24's ``LlamaConfig`` / ``MistralConfig`` for absent keys
and both rope shapes (rope types ``default``, ``linear``, ``yarn``, ``llama3``).

As in HF: ``llama`` reads ``attention_bias`` and ``mlp_bias`` and never slides;
``mistral`` has no biases and slides on every layer when ``sliding_window`` is set
(absent: 4096, HF's default; null: full causal). ``layer_types`` is ignored by both HF
classes, so it is here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius import config_fields as cf
from mobius.lm.config import FULL, SLIDING, DecoderConfig, read_decoder

LLAMA, MISTRAL = "llama", "mistral"
MODEL_TYPES = (LLAMA, MISTRAL)

_COMMON = {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32}
_DEFAULTS: dict[str, dict[str, Any]] = {
    LLAMA: {
        **_COMMON,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
        "bos_token_id": 1,
        "eos_token_id": (2,),
    },
    MISTRAL: {
        **_COMMON,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "bos_token_id": 1,
        "eos_token_id": (2,),
    },
}
MISTRAL_WINDOW = 4096


def read_config(
    model_type: str, raw: Mapping[str, Any], where: str = "config.json"
) -> DecoderConfig:
    """The typed config of a ``llama`` or ``mistral`` checkpoint (ConfigError on bad values)."""
    fields = read_decoder(
        model_type,
        raw,
        where,
        family="Mistral" if model_type == MISTRAL else "Llama",
        defaults=_DEFAULTS[model_type],
        bias_keys=("attention_bias", "mlp_bias") if model_type == LLAMA else (),
    )
    window = None
    if model_type == MISTRAL and raw.get("sliding_window", MISTRAL_WINDOW) is not None:
        window = cf.positive_int(
            raw, "sliding_window", MISTRAL_WINDOW, where, maximum=cf.MAX_POSITIONS
        )
    kind = FULL if window is None else SLIDING
    return DecoderConfig(
        **fields, layer_types=(kind,) * fields["num_hidden_layers"], sliding_window=window
    )
