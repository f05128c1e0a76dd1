"""The HF config fields every decoder LM shares, read once: sizes, rope, layer types.

:func:`read_decoder` returns the common fields of :class:`DecoderConfig` from a raw
``config.json`` (HF 5.24 semantics, the family's defaults for absent keys);
:func:`read_rope` resolves both rope shapes HF writes to one :class:`RopeParams`:

- Hub style: top-level ``rope_theta`` and an optional ``rope_scaling`` object whose type
  is under ``type`` or ``rope_type``;
- transformers 5 ``save_pretrained`` style: one ``rope_parameters`` object holding
  ``rope_type`` and ``rope_theta``.

As in HF, a non-empty ``rope_scaling`` wins over ``rope_parameters``; ``rope_theta``
missing from the object comes from the top level, else 10000; yarn and llama3 take
``original_max_position_embeddings`` from the top level, else from the object, else
``max_position_embeddings``. :func:`read_layer_types` checks a ``layer_types`` list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mobius import config_fields as cf

FULL, SLIDING = "full_attention", "sliding_attention"
STATIC_ROPE_TYPES = ("default", "linear", "yarn", "llama3")
"""Rope types whose frequencies are fixed at build time, hence exact in a static graph
(``dynamic`` and ``longrope`` depend on the running sequence length)."""
HF_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
"""HF ``hidden_act`` → :func:`mobius.components.activation` name."""


@dataclass(frozen=True)
class RopeParams:
    """The standardized HF ``rope_parameters`` (what :func:`mobius.components.rope_inv_freq`
    takes, via :meth:`as_dict`)."""

    rope_type: str
    rope_theta: float
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class DecoderConfig:
    """What a Llama-shaped decoder LM needs (a family's config subclasses it).

    ``layer_types[i]`` is :data:`FULL` or :data:`SLIDING`; ``sliding_window`` counts the
    keys a sliding layer sees, itself included (None: no layer slides). ``hidden_act`` is
    the :func:`mobius.components.activation` name.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    rope: RopeParams
    layer_types: tuple[str, ...]
    sliding_window: int | None
    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_id: tuple[int, ...]
    raw: Mapping[str, Any]

    def window(self, i: int) -> int | None:
        """Sliding window of layer ``i`` (None: full causal)."""
        return self.sliding_window if self.layer_types[i] == SLIDING else None


def read_decoder(
    model_type: str,
    raw: Mapping[str, Any],
    where: str,
    *,
    family: str,
    defaults: Mapping[str, Any],
    rope_types: Sequence[str] = STATIC_ROPE_TYPES,
    bias_keys: Sequence[str] = ("attention_bias", "mlp_bias"),
) -> dict[str, Any]:
    """The :class:`DecoderConfig` fields but ``layer_types`` / ``sliding_window``, as a dict.

    ``defaults`` holds the HF class defaults of ``vocab_size``, ``hidden_size``,
    ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads`` and optionally
    ``num_key_value_heads`` (else = heads), ``head_dim`` (else ``hidden // heads``),
    ``max_position_embeddings`` (32768), ``rms_norm_eps`` (1e-6), ``hidden_act``
    ("silu"), ``tie_word_embeddings`` (False), ``bos_token_id`` (None), ``eos_token_id``
    (``()``: a tuple). ``family`` names the model in errors.
    ``bias_keys``: which of ``attention_bias`` / ``mlp_bias`` the family's HF class reads
    (the others are False whatever config.json says).
    """
    d = defaults
    hidden = cf.positive_int(raw, "hidden_size", d["hidden_size"], where)
    heads = cf.positive_int(
        raw, "num_attention_heads", d["num_attention_heads"], where, maximum=cf.MAX_HEADS
    )
    kv_default = d.get("num_key_value_heads", heads)
    kv = cf.positive_int(raw, "num_key_value_heads", kv_default, where, maximum=cf.MAX_HEADS)
    if heads % kv:
        raise cf.fail(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
            cf.path(where, "num_key_value_heads"),
            "use a number of KV heads that divides the number of attention heads",
        )
    head_dim = cf.positive_int(raw, "head_dim", d.get("head_dim") or hidden // heads, where)
    if head_dim % 2:
        raise cf.fail(
            f"head_dim {head_dim} is odd; rotary embeddings rotate pairs",
            cf.path(where, "head_dim"),
            "use an even head_dim",
        )
    layers = cf.positive_int(
        raw, "num_hidden_layers", d["num_hidden_layers"], where, maximum=cf.MAX_LAYERS
    )
    max_positions = cf.positive_int(
        raw,
        "max_position_embeddings",
        d.get("max_position_embeddings", 32768),
        where,
        maximum=cf.MAX_POSITIONS,
    )
    act = cf.string(
        raw, "hidden_act", d.get("hidden_act", "silu"), where, choices=tuple(HF_ACTIVATIONS)
    )
    return {
        "model_type": model_type,
        "vocab_size": cf.positive_int(
            raw, "vocab_size", d["vocab_size"], where, maximum=cf.MAX_VOCAB
        ),
        "hidden_size": hidden,
        "intermediate_size": cf.positive_int(
            raw, "intermediate_size", d["intermediate_size"], where
        ),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "hidden_act": HF_ACTIVATIONS[act],
        "max_position_embeddings": max_positions,
        "rms_norm_eps": cf.finite_float(
            raw, "rms_norm_eps", d.get("rms_norm_eps", 1e-6), where, positive=True
        ),
        "tie_word_embeddings": cf.boolean(
            raw, "tie_word_embeddings", d.get("tie_word_embeddings", False), where
        ),
        **{
            key: key in bias_keys and cf.boolean(raw, key, False, where)
            for key in ("attention_bias", "mlp_bias")
        },
        "rope": read_rope(raw, where, max_positions, family=family, rope_types=rope_types),
        "pad_token_id": cf.optional_int(raw, "pad_token_id", where, maximum=cf.MAX_TOKEN_ID),
        "bos_token_id": cf.optional_int(raw, "bos_token_id", where, maximum=cf.MAX_TOKEN_ID)
        if "bos_token_id" in raw
        else d.get("bos_token_id"),
        "eos_token_id": tuple(
            cf.int_list(raw, "eos_token_id", where, maximum=cf.MAX_TOKEN_ID, scalar=True) or ()
        )
        if "eos_token_id" in raw
        else tuple(d.get("eos_token_id", ())),
        "raw": raw,
    }


def read_rope(
    raw: Mapping[str, Any],
    where: str,
    max_positions: int,
    *,
    family: str,
    rope_types: Sequence[str] = STATIC_ROPE_TYPES,
) -> RopeParams:
    """The rope of ``raw`` (either shape), one of ``rope_types``; ConfigError otherwise.

    A ``partial_rotary_factor`` other than 1.0 is refused (these decoders rotate the whole
    ``head_dim``).
    """
    scaling = cf.mapping(raw, "rope_scaling", where)
    params = cf.mapping(raw, "rope_parameters", where)
    key = "rope_scaling" if scaling else "rope_parameters"
    src: Mapping[str, Any] = (scaling or params) or {}
    at = cf.path(where, key)
    if "partial_rotary_factor" in src or "partial_rotary_factor" in raw:
        holder = src if "partial_rotary_factor" in src else raw
        prf = cf.finite_float(holder, "partial_rotary_factor", 1.0, at, positive=True)
        if prf != 1.0:
            raise cf.fail(
                f"partial_rotary_factor {prf} is not supported by {family} (HF rotates the "
                "whole head_dim)",
                cf.path(at, "partial_rotary_factor"),
                "remove partial_rotary_factor or set it to 1.0",
            )
    kind_key = "rope_type" if "rope_type" in src else "type"
    kind = cf.string(src, kind_key, "default", at)
    if kind not in rope_types:
        extra = (
            " (its frequencies depend on the running sequence length)"
            if kind in ("dynamic", "longrope")
            else ""
        )
        raise cf.fail(
            f"rope type {kind!r} is not supported for {family}{extra}",
            cf.path(at, kind_key),
            f"use one of {', '.join(rope_types)}",
        )
    top_theta = cf.finite_float(raw, "rope_theta", 10_000.0, where, positive=True)
    theta = cf.finite_float(src, "rope_theta", top_theta, at, positive=True)
    if kind == "default":
        return RopeParams(kind, theta)
    factor = cf.optional_float(src, "factor", at, positive=True)
    if factor is None and kind != "yarn":
        raise cf.fail(
            f"rope type {kind!r} needs a factor",
            cf.path(at, "factor"),
            'add "factor" (a number > 0) to the rope object',
        )
    if kind == "linear":
        return RopeParams(kind, theta, factor=factor)
    original = cf.optional_int(raw, "original_max_position_embeddings", where, minimum=1)
    if original is None:
        original = cf.integer(
            src,
            "original_max_position_embeddings",
            max_positions,
            at,
            minimum=1,
            maximum=cf.MAX_POSITIONS,
        )
    if kind == "yarn":
        return RopeParams(
            kind,
            theta,
            factor=factor if factor is not None else max_positions / original,
            original_max_position_embeddings=original,
            attention_factor=cf.optional_float(src, "attention_factor", at, positive=True),
            beta_fast=cf.optional_float(src, "beta_fast", at, positive=True),
            beta_slow=cf.optional_float(src, "beta_slow", at, positive=True),
            mscale=cf.optional_float(src, "mscale", at),
            mscale_all_dim=cf.optional_float(src, "mscale_all_dim", at),
            truncate=cf.boolean(src, "truncate", True, at),
        )
    low = cf.finite_float(src, "low_freq_factor", 1.0, at, positive=True)
    high = cf.finite_float(src, "high_freq_factor", 4.0, at, positive=True)
    if "low_freq_factor" not in src or "high_freq_factor" not in src or high == low:
        raise cf.fail(
            "rope type 'llama3' needs low_freq_factor and high_freq_factor (different values)",
            at,
            "add both keys to the rope object, as HF's llama3 rope requires",
        )
    return RopeParams(
        kind,
        theta,
        factor=factor,
        original_max_position_embeddings=original,
        low_freq_factor=low,
        high_freq_factor=high,
    )


def read_layer_types(
    raw: Mapping[str, Any],
    layers: int,
    window: int | None,
    where: str,
    *,
    default: Sequence[str],
) -> tuple[str, ...]:
    """Per layer :data:`FULL` / :data:`SLIDING`: ``raw["layer_types"]`` if given (checked:
    one known entry per layer), else ``default``. Without a window (``window`` None) every
    layer is full causal, as in HF, whatever the list says."""
    given = cf.str_list(raw, "layer_types", where)
    if given is None:
        given = list(default)
    elif len(given) != layers:
        raise cf.fail(
            f"layer_types has {len(given)} entries for {layers} layers",
            cf.path(where, "layer_types"),
            "give one entry per layer, or remove layer_types",
        )
    for i, t in enumerate(given):
        if t not in (FULL, SLIDING):
            raise cf.fail(
                f"layer_types[{i}]: unknown layer type {cf.show(t)}",
                cf.path(cf.path(where, "layer_types"), i),
                f"use {FULL} or {SLIDING}",
            )
    return tuple(t if window is not None else FULL for t in given)
