"""The typed ``gemma3_text`` config read from raw ``config.json`` (never transformers).

HF transformers 5.24's ``Gemma3TextConfig`` semantics, both config shapes:

- layer pattern: ``layer_types`` when given, else every ``sliding_window_pattern``-th
  layer (default 6) is full attention and the others slide (``sliding_window``, default
  4096; null: no layer slides);
- rope: the Hub writes ``rope_theta`` (full layers, default 1e6), ``rope_local_base_freq``
  (sliding layers, default 1e4) and an optional ``rope_scaling`` (full layers only);
  ``save_pretrained`` writes ``rope_parameters`` with one object per layer type. As in
  HF, ``rope_scaling`` is merged into the full layers' object, and a theta missing from
  an object comes from the top-level key;
- ``hidden_activation`` (HF's Gemma key; ``hidden_act`` is ignored as HF ignores it),
  ``query_pre_attn_scalar`` (attention scale ``q ** -0.5``), ``final_logit_softcapping``;
- ``attn_logit_softcapping`` is checked but not applied: HF 5.24's ``Gemma3Attention``
  stores it and never passes it to the attention function, so neither does the graph;
- ``use_bidirectional_attention`` (EmbeddingGemma) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius import config_fields as cf
from mobius.lm.config import (
    FULL,
    HF_ACTIVATIONS,
    SLIDING,
    GemmaConfig,
    RopeParams,
    read_decoder,
    read_layer_types,
    read_rope,
)

MODEL_TYPE = "gemma3_text"
FAMILY_NAME = "Gemma 3"
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "tie_word_embeddings": True,
    "bos_token_id": 2,
    "eos_token_id": (1,),
}
WINDOW, PATTERN = 4096, 6
THETA = {FULL: ("rope_theta", 1_000_000.0), SLIDING: ("rope_local_base_freq", 10_000.0)}
_OWN_KEYS = ("hidden_act", "rope_scaling", "rope_parameters")
"""Keys read here, not by :func:`read_decoder`."""


def read_config(model_type: str, raw: Mapping[str, Any], where: str = "config.json") -> GemmaConfig:
    """The typed config of a ``gemma3_text`` checkpoint (ConfigError on bad values)."""
    if cf.boolean(raw, "use_bidirectional_attention", False, where):
        raise cf.fail(
            "use_bidirectional_attention is not supported (an encoder such as EmbeddingGemma, "
            "not a causal LM)",
            cf.path(where, "use_bidirectional_attention"),
            "use a causal Gemma 3 checkpoint, or set it to false",
        )
    base = {k: v for k, v in raw.items() if k not in _OWN_KEYS}
    fields = read_decoder(
        model_type,
        base,
        where,
        family=FAMILY_NAME,
        defaults=_DEFAULTS,
        bias_keys=("attention_bias",),
    )
    act = cf.string(
        raw, "hidden_activation", "gelu_pytorch_tanh", where, choices=tuple(HF_ACTIVATIONS)
    )
    layers = fields["num_hidden_layers"]
    window = None
    if raw.get("sliding_window", WINDOW) is not None:
        window = cf.positive_int(raw, "sliding_window", WINDOW, where, maximum=cf.MAX_POSITIONS)
    pattern = cf.positive_int(raw, "sliding_window_pattern", PATTERN, where)
    default = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers)]
    ropes = {t: _rope(raw, t, where, fields["max_position_embeddings"]) for t in THETA}
    cf.optional_float(raw, "attn_logit_softcapping", where, positive=True)  # checked, unused
    return GemmaConfig(
        **{
            **fields,
            "hidden_act": HF_ACTIVATIONS[act],
            "rope": ropes[FULL],
            "pad_token_id": fields["pad_token_id"] if "pad_token_id" in raw else 0,
            "raw": raw,
        },
        layer_types=read_layer_types(raw, layers, window, where, default=default),
        sliding_window=window,
        query_pre_attn_scalar=cf.finite_float(
            raw, "query_pre_attn_scalar", 256, where, positive=True
        ),
        local_rope=ropes[SLIDING],
        final_logit_softcapping=cf.optional_float(
            raw, "final_logit_softcapping", where, positive=True
        ),
        attn_logit_softcapping=None,
        qk_norm=True,
    )


def _rope(raw: Mapping[str, Any], layer_type: str, where: str, max_positions: int) -> RopeParams:
    """The rope of ``layer_type``'s layers, as ``Gemma3TextConfig`` assembles it."""
    nested = cf.mapping(raw, "rope_parameters", where) or {}
    for key in nested:
        if key not in THETA:
            raise cf.fail(
                f"rope_parameters has a key {cf.show(key)}; Gemma 3 keeps one rope object "
                "per layer type",
                cf.path(cf.path(where, "rope_parameters"), key),
                f"use the keys {FULL} and {SLIDING}",
            )
    at = cf.path(cf.path(where, "rope_parameters"), layer_type)
    params = dict(cf.mapping(nested, layer_type, at) or {"rope_type": "default"})
    scaling = cf.mapping(raw, "rope_scaling", where) if layer_type == FULL else None
    if scaling:
        params.update(scaling)
        at = cf.path(where, "rope_scaling")
    theta_key, theta = THETA[layer_type]
    if params.get("rope_theta") is None:
        params["rope_theta"] = cf.finite_float(raw, theta_key, theta, where, positive=True)
    sub = {"rope_parameters": params}
    if "original_max_position_embeddings" in raw:
        sub["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
    return read_rope(sub, at, max_positions, family=FAMILY_NAME)
