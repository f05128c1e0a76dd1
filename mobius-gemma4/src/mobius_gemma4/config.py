"""Typed, frozen Gemma 4 configs read from raw ``config.json`` (never through transformers).

Both shapes of the same information resolve to identical configs (reference §2):
hub style (``global_head_dim`` / ``num_global_key_value_heads``) and the
``per_layer_config`` style transformers >= 5.15 writes. Missing keys take the
defaults of HF transformers 5.24 (``Gemma4TextConfig``), so a tiny config that omits
``hidden_size_per_layer_input`` gets PLE 256 exactly as HF does. Field names are the
checkpoint's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mobius.errors import ConfigError

FULL = "full_attention"
SLIDING = "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)

DEFAULT_ROPE: dict[str, dict[str, Any]] = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


@dataclass(frozen=True)
class RopeParams:
    """RoPE of one layer type: ``default`` or ``proportional`` (reference §3.3)."""

    rope_type: str
    rope_theta: float
    partial_rotary_factor: float = 1.0
    factor: float = 1.0


@dataclass(frozen=True)
class Gemma4TextConfig:
    """The text decoder of Gemma 4, with per-layer geometry resolved (reference §2.2)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    layer_types: tuple[str, ...]
    head_dims: tuple[int, ...]
    """Head dim of each layer (``hd_i``)."""
    kv_heads: tuple[int, ...]
    """KV heads of each layer (``kvh_i``)."""
    sliding_window: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_parameters: Mapping[str, RopeParams]
    final_logit_softcapping: float | None
    hidden_size_per_layer_input: int
    vocab_size_per_layer_input: int
    attention_k_eq_v: bool
    num_kv_shared_layers: int
    use_double_wide_mlp: bool
    enable_moe_block: bool
    num_experts: int | None
    top_k_experts: int | None
    moe_intermediate_size: int | None
    use_bidirectional_attention: str | None
    hidden_activation: str
    tie_word_embeddings: bool
    pad_token_id: int
    bos_token_id: int | None
    eos_token_id: tuple[int, ...]

    # ------------------------------------------------------------------ derived geometry

    @property
    def first_kv_shared_layer(self) -> int:
        """Index of the first KV-consumer layer (``L − N_sh``); layers below own a cache."""
        return self.num_hidden_layers - self.num_kv_shared_layers

    @property
    def num_cache_layers(self) -> int:
        """Number of layers with past/present ports; cache index i equals layer index i."""
        return self.first_kv_shared_layer

    def is_kv_consumer(self, i: int) -> bool:
        return i >= self.first_kv_shared_layer

    def kv_producer(self, i: int) -> int:
        """The layer whose post-update K/V a consumer layer ``i`` reads (reference §3.4)."""
        t = self.layer_types[i]
        owners = [j for j in range(self.first_kv_shared_layer) if self.layer_types[j] == t]
        return owners[-1]

    def mlp_width(self, i: int) -> int:
        """Dense MLP intermediate width of layer ``i`` (doubled on consumers if double-wide)."""
        wide = self.use_double_wide_mlp and self.is_kv_consumer(i)
        return self.intermediate_size * (2 if wide else 1)

    def uses_k_eq_v(self, i: int) -> bool:
        """V is the raw K projection on full layers of k_eq_v models."""
        return self.attention_k_eq_v and self.layer_types[i] == FULL

    @property
    def has_ple(self) -> bool:
        return bool(self.hidden_size_per_layer_input)

    @property
    def ple_width(self) -> int:
        """``L · D_ple``: width of the packed per-layer input."""
        return self.num_hidden_layers * self.hidden_size_per_layer_input

    def layer_type_dim(self, layer_type: str) -> int:
        """Head dim of a layer type (all layers of one type share it)."""
        return next(d for d, t in zip(self.head_dims, self.layer_types) if t == layer_type)


@dataclass(frozen=True)
class Gemma4Config:
    """What a Gemma 4 package is built from: the model type, the text config, token ids.

    ``vision_config`` / ``audio_config`` keep the raw JSON for the encoder builders a
    later issue adds; text builds do not read them.
    """

    model_type: str
    text: Gemma4TextConfig
    image_token_id: int | None = None
    video_token_id: int | None = None
    audio_token_id: int | None = None
    boi_token_id: int | None = None
    eoi_token_id: int | None = None
    boa_token_id: int | None = None
    eoa_token_index: int | None = None
    vision_config: Mapping[str, Any] | None = None
    audio_config: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def placeholder_token_ids(self) -> tuple[int, ...]:
        """Image, video and audio placeholders, mapped to pad before lookups (reference §3.1)."""
        ids = (self.image_token_id, self.video_token_id, self.audio_token_id)
        return tuple(i for i in ids if i is not None)


# ---------------------------------------------------------------------------- reading


def _err(what: str, where: str, fix: str) -> ConfigError:
    return ConfigError(what, where=where, fix=fix)


def _int(cfg: Mapping[str, Any], key: str, default: int | None, where: str) -> int:
    value = cfg.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _err(
            f"{key} must be a non-negative integer, got {value!r}",
            f"{where}.{key}",
            "fix the value in config.json",
        )
    return value


def _positive(cfg: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = _int(cfg, key, default, where)
    if value == 0:
        raise _err(f"{key} must be positive, got 0", f"{where}.{key}", "fix config.json")
    return value


def _optional_int(cfg: Mapping[str, Any], key: str, where: str) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    return _int(cfg, key, None, where)


def _rope(cfg: Mapping[str, Any], where: str) -> dict[str, RopeParams]:
    raw = cfg.get("rope_parameters") or DEFAULT_ROPE
    if not isinstance(raw, Mapping):
        raise _err(
            "rope_parameters must be an object", f"{where}.rope_parameters", "fix config.json"
        )
    out: dict[str, RopeParams] = {}
    for layer_type in LAYER_TYPES:
        p = raw.get(layer_type) or DEFAULT_ROPE[layer_type]
        rope_type = p.get("rope_type", "default")
        if rope_type not in ("default", "proportional"):
            raise _err(
                f"unsupported rope_type {rope_type!r} for {layer_type}",
                f"{where}.rope_parameters.{layer_type}.rope_type",
                "Gemma 4 uses 'default' (sliding) and 'proportional' (full)",
            )
        out[layer_type] = RopeParams(
            rope_type=rope_type,
            rope_theta=float(p.get("rope_theta", DEFAULT_ROPE[layer_type]["rope_theta"])),
            partial_rotary_factor=float(p.get("partial_rotary_factor", 1.0)),
            factor=float(p.get("factor", 1.0)),
        )
    return out


def read_text_config(cfg: Mapping[str, Any], where: str = "config.json") -> Gemma4TextConfig:
    """Resolve a ``gemma4_text`` config dict (top level or ``text_config``) as HF 5.24 does."""
    if not isinstance(cfg, Mapping):
        raise _err("text config must be a JSON object", where, "fix config.json")
    L = _positive(cfg, "num_hidden_layers", 30, where)
    layer_types = list(cfg.get("layer_types") or [])
    if not layer_types:
        layer_types = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(L)]
    if len(layer_types) != L:
        raise _err(
            f"layer_types has {len(layer_types)} entries but num_hidden_layers is {L}",
            f"{where}.layer_types",
            "give one layer type per layer",
        )
    for i, t in enumerate(layer_types):
        if t not in LAYER_TYPES:
            raise _err(
                f"unknown layer type {t!r} at index {i}",
                f"{where}.layer_types[{i}]",
                f"use one of {LAYER_TYPES}",
            )
    layer_types[-1] = FULL  # HF forces the last layer to full attention

    bidir = cfg.get("use_bidirectional_attention")
    if bidir == "all":
        raise _err(
            "use_bidirectional_attention = 'all' (fully bidirectional text) is not supported",
            f"{where}.use_bidirectional_attention",
            "mobius builds causal Gemma 4 decoders; use null or 'vision'",
        )
    if bidir not in (None, "vision"):
        raise _err(
            f"unknown use_bidirectional_attention {bidir!r}",
            f"{where}.use_bidirectional_attention",
            "use null or 'vision'",
        )

    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    head_dim = _positive(cfg, "head_dim", 256, where)
    kvh = _positive(cfg, "num_key_value_heads", 4, where)
    if "per_layer_config" in cfg and cfg["per_layer_config"] is not None:
        plc = cfg["per_layer_config"]
        if not isinstance(plc, Mapping):
            raise _err("per_layer_config must be an object", f"{where}.per_layer_config", "fix it")
        overrides: dict[int, Mapping[str, Any]] = {}
        for k, v in plc.items():
            try:
                idx = int(k)
            except ValueError:
                idx = -1
            if not 0 <= idx < L or not isinstance(v, Mapping):
                raise _err(
                    f"bad per_layer_config entry {k!r}",
                    f"{where}.per_layer_config.{k}",
                    "keys are layer indices 0..L-1 mapping to objects",
                )
            overrides[idx] = v
    else:
        o: dict[str, Any] = {"head_dim": cfg.get("global_head_dim", 512)}
        if k_eq_v and cfg.get("num_global_key_value_heads") is not None:
            o["num_key_value_heads"] = cfg["num_global_key_value_heads"]
        overrides = {i: o for i, t in enumerate(layer_types) if t == FULL}
    head_dims = tuple(
        _positive(overrides.get(i, {}), "head_dim", head_dim, f"{where}.layer {i}")
        for i in range(L)
    )
    kv_heads = tuple(
        _positive(overrides.get(i, {}), "num_key_value_heads", kvh, f"{where}.layer {i}")
        for i in range(L)
    )
    n_heads = _positive(cfg, "num_attention_heads", 8, where)
    for i in range(L):
        if n_heads % kv_heads[i]:
            raise _err(
                f"layer {i}: num_attention_heads {n_heads} is not a multiple of its KV heads "
                f"{kv_heads[i]}",
                f"{where}.num_key_value_heads",
                "fix the head counts",
            )
    for t in set(layer_types):
        dims = {head_dims[i] for i in range(L) if layer_types[i] == t}
        if len(dims) != 1:
            raise _err(
                f"layers of type {t} have different head dims {sorted(dims)}",
                f"{where}.per_layer_config",
                "mobius needs one head dim per layer type",
            )

    n_sh = _int(cfg, "num_kv_shared_layers", 0, where)
    if n_sh >= L:
        raise _err(
            f"num_kv_shared_layers {n_sh} leaves no layer owning a KV cache",
            f"{where}.num_kv_shared_layers",
            "use a value below num_hidden_layers",
        )
    if n_sh:
        owners = set(layer_types[: L - n_sh])
        if owners != set(layer_types):
            raise _err(
                "some KV-sharing layer type has no cache-owning layer before the shared block",
                f"{where}.num_kv_shared_layers",
                "each layer type used after L - num_kv_shared_layers must occur before it",
            )

    moe = bool(cfg.get("enable_moe_block", False))
    num_experts = _optional_int(cfg, "num_experts", where)
    top_k = _optional_int(cfg, "top_k_experts", where)
    moe_i = _optional_int(cfg, "moe_intermediate_size", where)
    if moe and not (num_experts and top_k and moe_i and top_k <= num_experts):
        raise _err(
            "enable_moe_block needs num_experts, top_k_experts <= num_experts and "
            "moe_intermediate_size",
            where,
            "set the MoE sizes in config.json",
        )
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise _err(
            f"unsupported hidden_activation {act!r}",
            f"{where}.hidden_activation",
            "Gemma 4 uses gelu_pytorch_tanh",
        )
    if cfg.get("attention_bias", False):
        raise _err("attention_bias = true is not supported", f"{where}.attention_bias", "set false")

    softcap = cfg.get("final_logit_softcapping")
    eos = cfg.get("eos_token_id", 1)
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    ple = cfg.get("hidden_size_per_layer_input", 256)
    return Gemma4TextConfig(
        vocab_size=_positive(cfg, "vocab_size", 262_144, where),
        hidden_size=_positive(cfg, "hidden_size", 2304, where),
        intermediate_size=_positive(cfg, "intermediate_size", 9216, where),
        num_hidden_layers=L,
        num_attention_heads=n_heads,
        layer_types=tuple(layer_types),
        head_dims=head_dims,
        kv_heads=kv_heads,
        sliding_window=_positive(cfg, "sliding_window", 512, where),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=_positive(cfg, "max_position_embeddings", 131_072, where),
        rope_parameters=_rope(cfg, where),
        final_logit_softcapping=None if softcap is None else float(softcap),
        hidden_size_per_layer_input=int(ple) if ple else 0,
        vocab_size_per_layer_input=_int(cfg, "vocab_size_per_layer_input", 262_144, where),
        attention_k_eq_v=k_eq_v,
        num_kv_shared_layers=n_sh,
        use_double_wide_mlp=bool(cfg.get("use_double_wide_mlp", False)),
        enable_moe_block=moe,
        num_experts=num_experts,
        top_k_experts=top_k,
        moe_intermediate_size=moe_i,
        use_bidirectional_attention=bidir,
        hidden_activation=act,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        pad_token_id=_int(cfg, "pad_token_id", 0, where),
        bos_token_id=_optional_int(cfg, "bos_token_id", where),
        eos_token_id=eos_ids,
    )


_MM_DEFAULTS = {
    "boi_token_id": 255_999,
    "eoi_token_id": 258_882,
    "image_token_id": 258_880,
    "video_token_id": 258_884,
    "boa_token_id": 256_000,
    "eoa_token_index": 258_883,
    "audio_token_id": 258_881,
}

MODEL_TYPES = ("gemma4", "gemma4_text")


def read_config(model_type: str, raw: Mapping[str, Any]) -> Gemma4Config:
    """Read ``config.json`` of a ``gemma4`` or ``gemma4_text`` checkpoint."""
    if model_type == "gemma4_text":
        return Gemma4Config(model_type=model_type, text=read_text_config(raw), raw=raw)
    if model_type != "gemma4":
        raise _err(
            f"mobius-gemma4 cannot read model_type {model_type!r}",
            "config.json.model_type",
            f"supported: {', '.join(MODEL_TYPES)}",
        )
    text = raw.get("text_config")
    if text is None:
        text = {}
    text = dict(text)
    # HF Gemma4Config's own tie_word_embeddings governs the head of the multimodal model.
    if "tie_word_embeddings" in raw:
        text["tie_word_embeddings"] = raw["tie_word_embeddings"]
    ids = {k: raw.get(k, d) for k, d in _MM_DEFAULTS.items()}
    return Gemma4Config(
        model_type=model_type,
        text=read_text_config(text, "config.json.text_config"),
        vision_config=raw.get("vision_config"),
        audio_config=raw.get("audio_config"),
        raw=raw,
        **ids,
    )


def embed_scale(hidden: int, dtype: str) -> float:
    """``sqrt(hidden)`` rounded to the build dtype like HF's weight-dtype buffer (reference §3.1)."""
    import numpy as np

    value = np.float32(math.sqrt(hidden))
    if dtype == "bf16":
        import ml_dtypes

        return float(np.float32(value).astype(ml_dtypes.bfloat16))
    if dtype == "f16":
        return float(value.astype(np.float16))
    return float(value)
