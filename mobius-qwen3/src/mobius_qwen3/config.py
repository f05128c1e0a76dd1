"""Typed, frozen Qwen3 / Qwen3-MoE configs read from raw ``config.json`` (never transformers).

Missing keys take the defaults of HF transformers 5.24 (``Qwen3Config``,
``Qwen3MoeConfig``), which differ between the two model types (hidden 4096 vs 2048,
head_dim 128 vs ``hidden // heads``, ...). Both config shapes HF writes resolve to the
same :class:`RopeParams`:

- Hub style (every released Qwen3 checkpoint): top-level ``rope_theta`` and an optional
  ``rope_scaling`` object whose type is under ``type`` or ``rope_type``;
- transformers 5 ``save_pretrained`` style: one ``rope_parameters`` object holding
  ``rope_type`` and ``rope_theta``.

As in HF, a non-empty ``rope_scaling`` wins over ``rope_parameters``; ``rope_theta``
missing from the object comes from the top level, else 10000; yarn and llama3 take
``original_max_position_embeddings`` from the top level, else ``max_position_embeddings``.

Layer geometry, also as HF: ``sliding_window`` counts only with ``use_sliding_window``;
qwen3 slides on ``layer_types`` entries ``sliding_attention`` (default: layers
``i >= max_window_layers``), qwen3_moe on every layer. A qwen3_moe layer is sparse when it
is not in ``mlp_only_layers``, ``num_experts > 0`` and ``(i + 1) % decoder_sparse_step == 0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mobius import config_fields as cf

QWEN3, QWEN3_MOE = "qwen3", "qwen3_moe"
MODEL_TYPES = (QWEN3, QWEN3_MOE)
FULL, SLIDING = "full_attention", "sliding_attention"
ROPE_TYPES = ("default", "linear", "yarn", "llama3")
"""Rope types whose frequencies are fixed at build time, hence exact in a static graph."""
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
"""HF ``hidden_act`` → :func:`mobius.components.activation` name."""

_DEFAULTS: dict[str, dict[str, Any]] = {
    QWEN3: {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "head_dim": 128,
    },
    QWEN3_MOE: {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "moe_intermediate_size": 768,
        "num_experts_per_tok": 8,
        "num_experts": 128,
    },
}


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
class Qwen3Config:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    """The :func:`mobius.components.activation` name of HF's ``hidden_act``."""
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    rope: RopeParams
    layer_types: tuple[str, ...]
    sliding_window: int | None
    """Keys a sliding layer sees, itself included (None: no layer slides)."""
    sparse_layers: tuple[bool, ...]
    """Per layer: routed experts (qwen3_moe) instead of the dense MLP."""
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_id: tuple[int, ...]
    raw: Mapping[str, Any]

    @property
    def is_moe(self) -> bool:
        return any(self.sparse_layers)

    def window(self, i: int) -> int | None:
        """Sliding window of layer ``i`` (None: full causal)."""
        return self.sliding_window if self.layer_types[i] == SLIDING else None


def _rope(raw: Mapping[str, Any], where: str, max_positions: int) -> RopeParams:
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
                f"partial_rotary_factor {prf} is not supported by Qwen3 (HF rotates the "
                "whole head_dim)",
                cf.path(at, "partial_rotary_factor"),
                "remove partial_rotary_factor or set it to 1.0",
            )
    kind_key = "rope_type" if "rope_type" in src else "type"
    kind = cf.string(src, kind_key, "default", at)
    if kind not in ROPE_TYPES:
        extra = (
            " (its frequencies depend on the running sequence length)"
            if kind in ("dynamic", "longrope")
            else ""
        )
        raise cf.fail(
            f"rope type {kind!r} is not supported for Qwen3{extra}",
            cf.path(at, kind_key),
            f"use one of {', '.join(ROPE_TYPES)}",
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


def _layer_types(
    raw: Mapping[str, Any], model_type: str, layers: int, window: int | None, where: str
) -> tuple[str, ...]:
    if model_type == QWEN3_MOE:
        return (SLIDING if window is not None else FULL,) * layers
    given = cf.str_list(raw, "layer_types", where)
    if given is None:
        first = cf.nonneg_int(raw, "max_window_layers", 28, where, maximum=cf.MAX_LAYERS)
        return tuple(SLIDING if window is not None and i >= first else FULL for i in range(layers))
    if len(given) != layers:
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
    # HF: without use_sliding_window a "sliding" layer has no window, i.e. is full causal
    return tuple(t if window is not None else FULL for t in given)


def _sparse_layers(raw: Mapping[str, Any], layers: int, experts: int, where: str):
    only = cf.int_list(raw, "mlp_only_layers", where, maximum=cf.MAX_LAYERS) or ()
    step = cf.positive_int(raw, "decoder_sparse_step", 1, where, maximum=cf.MAX_LAYERS)
    return tuple(i not in only and experts > 0 and (i + 1) % step == 0 for i in range(layers))


def read_config(model_type: str, raw: Mapping[str, Any], where: str = "config.json") -> Qwen3Config:
    """The typed config of a ``qwen3`` or ``qwen3_moe`` checkpoint (ConfigError on bad values)."""
    d = _DEFAULTS[model_type]
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
        raw, "max_position_embeddings", 32768, where, maximum=cf.MAX_POSITIONS
    )
    use_window = cf.boolean(raw, "use_sliding_window", False, where)
    window = cf.positive_int(raw, "sliding_window", 4096, where, maximum=cf.MAX_POSITIONS)
    window_or_none = window if use_window else None
    act = cf.string(raw, "hidden_act", "silu", where, choices=tuple(ACTIVATIONS))
    moe = model_type == QWEN3_MOE
    experts, top_k, moe_width, norm_topk = 0, 0, 0, False
    sparse = (False,) * layers
    if moe:
        key = "num_experts" if "num_experts" in raw else "num_local_experts"
        experts = cf.nonneg_int(raw, key, d["num_experts"], where, maximum=cf.MAX_EXPERTS)
        top_k = cf.positive_int(
            raw, "num_experts_per_tok", d["num_experts_per_tok"], where, maximum=cf.MAX_EXPERTS
        )
        if experts and top_k > experts:
            raise cf.fail(
                f"num_experts_per_tok {top_k} exceeds num_experts {experts}",
                cf.path(where, "num_experts_per_tok"),
                "route each token to at most num_experts experts",
            )
        moe_width = cf.positive_int(raw, "moe_intermediate_size", d["moe_intermediate_size"], where)
        norm_topk = cf.boolean(raw, "norm_topk_prob", False, where)
        sparse = _sparse_layers(raw, layers, experts, where)
    eos = cf.int_list(raw, "eos_token_id", where, maximum=cf.MAX_TOKEN_ID, scalar=True) or ()
    return Qwen3Config(
        model_type=model_type,
        vocab_size=cf.positive_int(raw, "vocab_size", d["vocab_size"], where, maximum=cf.MAX_VOCAB),
        hidden_size=hidden,
        intermediate_size=cf.positive_int(raw, "intermediate_size", d["intermediate_size"], where),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        hidden_act=ACTIVATIONS[act],
        max_position_embeddings=max_positions,
        rms_norm_eps=cf.finite_float(raw, "rms_norm_eps", 1e-6, where, positive=True),
        tie_word_embeddings=cf.boolean(raw, "tie_word_embeddings", False, where),
        attention_bias=cf.boolean(raw, "attention_bias", False, where),
        rope=_rope(raw, where, max_positions),
        layer_types=_layer_types(raw, model_type, layers, window_or_none, where),
        sliding_window=window_or_none,
        sparse_layers=sparse,
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_width,
        norm_topk_prob=norm_topk,
        pad_token_id=cf.optional_int(raw, "pad_token_id", where, maximum=cf.MAX_TOKEN_ID),
        bos_token_id=cf.optional_int(raw, "bos_token_id", where, maximum=cf.MAX_TOKEN_ID),
        eos_token_id=eos,
        raw=raw,
    )
