"""Typed, frozen Gemma 4 configs read from raw ``config.json`` (never through transformers).

Both shapes of the same information resolve to identical configs (docs/gemma4.md §2):
hub style (``global_head_dim`` / ``num_global_key_value_heads``) and the
``per_layer_config`` style transformers >= 5.15 writes. Missing keys take the
defaults of HF transformers 5.24 (``Gemma4TextConfig``), so a tiny config that omits
``hidden_size_per_layer_input`` gets PLE 256 exactly as HF does. Field names are the
checkpoint's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mobius import config_fields as cf

FULL = "full_attention"
SLIDING = "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)

DEFAULT_ROPE: dict[str, dict[str, Any]] = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


@dataclass(frozen=True)
class RopeParams:
    """RoPE of one layer type: ``default`` or ``proportional`` (docs/gemma4.md §3.3)."""

    rope_type: str
    rope_theta: float
    partial_rotary_factor: float = 1.0
    factor: float = 1.0


@dataclass(frozen=True)
class Gemma4TextConfig:
    """The text decoder of Gemma 4, with per-layer geometry resolved (docs/gemma4.md §2.2)."""

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
        """The layer whose post-update K/V a consumer layer ``i`` reads (docs/gemma4.md §3.4)."""
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
    """What a Gemma 4 package is built from: the model type, the text config, token ids,
    and the encoder sections read once: ``vision`` (:class:`~mobius_gemma4.vision.config.
    Gemma4VisionConfig`, or the unified model's ``UnifiedVisionConfig``) and ``audio``
    (``Gemma4AudioConfig`` / ``UnifiedAudioConfig``), None where ``config.json`` has none.
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
    vision: Any = None
    audio: Any = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def placeholder_token_ids(self) -> tuple[int, ...]:
        """Image, video and audio placeholders, mapped to pad before lookups (docs/gemma4.md §3.1)."""
        ids = (self.image_token_id, self.video_token_id, self.audio_token_id)
        return tuple(i for i in ids if i is not None)


# ---------------------------------------------------------------------------- reading
#
# Every raw value goes through mobius.config_fields, so malformed JSON (wrong
# types, NaN, absurd sizes) is a ConfigError naming its key path, never a bare
# TypeError, and no size can make the loops below run away (at most MAX_LAYERS).


def _rope(cfg: Mapping[str, Any], where: str) -> dict[str, RopeParams]:
    """``rope_parameters`` per layer type; absent, null or empty entries take HF defaults."""
    raw = cf.mapping(cfg, "rope_parameters", where) or DEFAULT_ROPE
    rope_where = cf.path(where, "rope_parameters")
    out: dict[str, RopeParams] = {}
    for layer_type in LAYER_TYPES:
        p = cf.mapping(raw, layer_type, rope_where) or DEFAULT_ROPE[layer_type]
        at = cf.path(rope_where, layer_type)
        out[layer_type] = RopeParams(
            rope_type=cf.string(p, "rope_type", "default", at, choices=("default", "proportional")),
            rope_theta=cf.finite_float(
                p, "rope_theta", DEFAULT_ROPE[layer_type]["rope_theta"], at, positive=True
            ),
            partial_rotary_factor=cf.finite_float(
                p, "partial_rotary_factor", 1.0, at, positive=True, maximum=1.0
            ),
            factor=cf.finite_float(p, "factor", 1.0, at, positive=True),
        )
    return out


def _layer_types(cfg: Mapping[str, Any], L: int, where: str) -> list[str]:
    """One type per layer (HF's 5-sliding-1-full default when absent); the last is full."""
    given = cf.str_list(cfg, "layer_types", where)
    if not given:
        layer_types = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(L)]
    else:
        layer_types = list(given)
    if len(layer_types) != L:
        raise cf.fail(
            f"layer_types has {len(layer_types)} entries but num_hidden_layers is {L}",
            cf.path(where, "layer_types"),
            "give one layer type per layer",
        )
    for i, t in enumerate(layer_types):
        if t not in LAYER_TYPES:
            raise cf.fail(
                f"unknown layer type {t!r} at index {i}",
                cf.path(cf.path(where, "layer_types"), i),
                f"use one of {', '.join(LAYER_TYPES)}",
            )
    layer_types[-1] = FULL  # HF forces the last layer to full attention
    return layer_types


def _layer_index(key: Any, L: int) -> int | None:
    """The layer a ``per_layer_config`` key names (``"5"`` or 5), or None if it names none."""
    if cf.is_int(key):
        idx = key
    elif isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 6:
        idx = int(key)
    else:
        return None
    return idx if 0 <= idx < L else None


def _overrides(
    cfg: Mapping[str, Any], L: int, layer_types: list[str], k_eq_v: bool, where: str
) -> dict[int, tuple[Mapping[str, Any], str]]:
    """Per-layer ``head_dim`` / ``num_key_value_heads`` overrides and where each came from.

    ``per_layer_config`` wins when present (docs/gemma4.md §2.1); otherwise full layers take
    ``global_head_dim`` (default 512, null → ``head_dim``) and, with k_eq_v,
    ``num_global_key_value_heads``.
    """
    plc = cf.mapping(cfg, "per_layer_config", where)
    if plc is not None:
        overrides: dict[int, tuple[Mapping[str, Any], str]] = {}
        plc_where = cf.path(where, "per_layer_config")
        for k, v in plc.items():
            idx = _layer_index(k, L)
            if idx is None or not isinstance(v, Mapping):
                raise cf.fail(
                    f"bad per_layer_config entry {str(k)[:40]!r}",
                    cf.path(plc_where, str(k)[:40]),
                    f"keys are layer indices 0..{L - 1} mapping to objects",
                )
            overrides[idx] = (v, cf.path(plc_where, str(k)))
        return overrides
    o: dict[str, Any] = {}
    raw_hd = cfg.get("global_head_dim", 512)
    if raw_hd is not None:
        o["head_dim"] = cf.positive_int(cfg, "global_head_dim", 512, where)
    if k_eq_v and cfg.get("num_global_key_value_heads") is not None:
        o["num_key_value_heads"] = cf.positive_int(
            cfg, "num_global_key_value_heads", 1, where, maximum=cf.MAX_HEADS
        )
    return {i: (o, where) for i, t in enumerate(layer_types) if t == FULL}


def _geometry(
    cfg: Mapping[str, Any], L: int, layer_types: list[str], k_eq_v: bool, where: str
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Head dim and KV heads of every layer, and the query head count, cross-checked."""
    head_dim = cf.positive_int(cfg, "head_dim", 256, where)
    kvh = cf.positive_int(cfg, "num_key_value_heads", 4, where, maximum=cf.MAX_HEADS)
    n_heads = cf.positive_int(cfg, "num_attention_heads", 8, where, maximum=cf.MAX_HEADS)
    overrides = _overrides(cfg, L, layer_types, k_eq_v, where)
    none: tuple[Mapping[str, Any], str] = ({}, where)
    head_dims = []
    kv_heads = []
    for i in range(L):
        o, at = overrides.get(i, none)
        head_dims.append(cf.positive_int(o, "head_dim", head_dim, at))
        kv_heads.append(cf.positive_int(o, "num_key_value_heads", kvh, at, maximum=cf.MAX_HEADS))
        if n_heads % kv_heads[i]:
            raise cf.fail(
                f"layer {i}: num_attention_heads {n_heads} is not a multiple of its KV heads "
                f"{kv_heads[i]}",
                cf.path(at, "num_key_value_heads"),
                "fix the head counts",
            )
    for t in set(layer_types):
        dims = {head_dims[i] for i in range(L) if layer_types[i] == t}
        if len(dims) != 1:
            raise cf.fail(
                f"layers of type {t} have different head dims {sorted(dims)}",
                cf.path(where, "per_layer_config"),
                "mobius needs one head dim per layer type",
            )
    return tuple(head_dims), tuple(kv_heads), n_heads


def _kv_shared(cfg: Mapping[str, Any], L: int, layer_types: list[str], where: str) -> int:
    """``num_kv_shared_layers``: below L, and every shared type has an owner before the block."""
    n_sh = cf.nonneg_int(cfg, "num_kv_shared_layers", 0, where, maximum=cf.MAX_LAYERS)
    if n_sh >= L:
        raise cf.fail(
            f"num_kv_shared_layers {n_sh} leaves no layer owning a KV cache",
            cf.path(where, "num_kv_shared_layers"),
            "use a value below num_hidden_layers",
        )
    if n_sh and set(layer_types[: L - n_sh]) != set(layer_types):
        raise cf.fail(
            "some KV-sharing layer type has no cache-owning layer before the shared block",
            cf.path(where, "num_kv_shared_layers"),
            "each layer type used after L - num_kv_shared_layers must occur before it",
        )
    return n_sh


def _bidirectional(cfg: Mapping[str, Any], where: str) -> str | None:
    bidir = cfg.get("use_bidirectional_attention")
    if bidir is None:
        return None
    if bidir == "all":
        raise cf.fail(
            "use_bidirectional_attention = 'all' (fully bidirectional text) is not supported",
            cf.path(where, "use_bidirectional_attention"),
            "mobius builds causal Gemma 4 decoders; use null or 'vision'",
        )
    return cf.string(cfg, "use_bidirectional_attention", "vision", where, choices=("vision",))


def _ple(cfg: Mapping[str, Any], where: str) -> int:
    """``hidden_size_per_layer_input``: absent → 256 (HF 5.24), null or 0 → PLE off."""
    if "hidden_size_per_layer_input" in cfg and cfg["hidden_size_per_layer_input"] is None:
        return 0
    return cf.nonneg_int(cfg, "hidden_size_per_layer_input", 256, where)


def _eos(cfg: Mapping[str, Any], where: str) -> tuple[int, ...]:
    """``eos_token_id``: one id or a list of ids (absent → 1, null → none)."""
    if "eos_token_id" not in cfg:
        return (1,)
    ids = cf.int_list(cfg, "eos_token_id", where, maximum=cf.MAX_TOKEN_ID, max_len=64, scalar=True)
    return ids or ()


def _moe(cfg: Mapping[str, Any], where: str) -> tuple[bool, int | None, int | None, int | None]:
    moe = cf.boolean(cfg, "enable_moe_block", False, where)
    num_experts = cf.optional_int(cfg, "num_experts", where, maximum=cf.MAX_EXPERTS)
    top_k = cf.optional_int(cfg, "top_k_experts", where, maximum=cf.MAX_EXPERTS)
    moe_i = cf.optional_int(cfg, "moe_intermediate_size", where)
    if moe and not (num_experts and top_k and moe_i and top_k <= num_experts):
        raise cf.fail(
            "enable_moe_block needs num_experts, top_k_experts <= num_experts and "
            "moe_intermediate_size",
            where,
            "set the MoE sizes in config.json",
        )
    return moe, num_experts, top_k, moe_i


def read_text_config(cfg: Mapping[str, Any], where: str = "config.json") -> Gemma4TextConfig:
    """Resolve a ``gemma4_text`` config dict (top level or ``text_config``) as HF 5.24 does."""
    if not isinstance(cfg, Mapping):
        raise cf.fail("text config must be a JSON object", where, "fix config.json")
    L = cf.positive_int(cfg, "num_hidden_layers", 30, where, maximum=cf.MAX_LAYERS)
    layer_types = _layer_types(cfg, L, where)
    bidir = _bidirectional(cfg, where)
    k_eq_v = cf.boolean(cfg, "attention_k_eq_v", False, where)
    head_dims, kv_heads, n_heads = _geometry(cfg, L, layer_types, k_eq_v, where)
    n_sh = _kv_shared(cfg, L, layer_types, where)
    moe, num_experts, top_k, moe_i = _moe(cfg, where)
    act = cf.string(
        cfg, "hidden_activation", "gelu_pytorch_tanh", where, choices=("gelu_pytorch_tanh",)
    )
    if cf.boolean(cfg, "attention_bias", False, where):
        raise cf.fail(
            "attention_bias = true is not supported",
            cf.path(where, "attention_bias"),
            "set false",
        )
    return Gemma4TextConfig(
        vocab_size=cf.positive_int(cfg, "vocab_size", 262_144, where, maximum=cf.MAX_VOCAB),
        hidden_size=cf.positive_int(cfg, "hidden_size", 2304, where),
        intermediate_size=cf.positive_int(cfg, "intermediate_size", 9216, where),
        num_hidden_layers=L,
        num_attention_heads=n_heads,
        layer_types=tuple(layer_types),
        head_dims=head_dims,
        kv_heads=kv_heads,
        sliding_window=cf.positive_int(cfg, "sliding_window", 512, where, maximum=cf.MAX_POSITIONS),
        rms_norm_eps=cf.finite_float(cfg, "rms_norm_eps", 1e-6, where, positive=True),
        max_position_embeddings=cf.positive_int(
            cfg, "max_position_embeddings", 131_072, where, maximum=cf.MAX_POSITIONS
        ),
        rope_parameters=_rope(cfg, where),
        final_logit_softcapping=cf.optional_float(
            cfg, "final_logit_softcapping", where, positive=True
        ),
        hidden_size_per_layer_input=_ple(cfg, where),
        vocab_size_per_layer_input=cf.nonneg_int(
            cfg, "vocab_size_per_layer_input", 262_144, where, maximum=cf.MAX_VOCAB
        ),
        attention_k_eq_v=k_eq_v,
        num_kv_shared_layers=n_sh,
        use_double_wide_mlp=cf.boolean(cfg, "use_double_wide_mlp", False, where),
        enable_moe_block=moe,
        num_experts=num_experts,
        top_k_experts=top_k,
        moe_intermediate_size=moe_i,
        use_bidirectional_attention=bidir,
        hidden_activation=act,
        tie_word_embeddings=cf.boolean(cfg, "tie_word_embeddings", True, where),
        pad_token_id=cf.nonneg_int(cfg, "pad_token_id", 0, where, maximum=cf.MAX_TOKEN_ID),
        bos_token_id=cf.optional_int(cfg, "bos_token_id", where, maximum=cf.MAX_TOKEN_ID),
        eos_token_id=_eos(cfg, where),
    )


# The media token ids of HF 5.24's Gemma4Config; Gemma4UnifiedConfig has the same ones.
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


def read_media_token_ids(raw: Mapping[str, Any], where: str) -> dict[str, int | None]:
    """The media token ids of a multimodal config (``gemma4`` and ``gemma4_unified``).

    Explicit null keeps a placeholder off; absent takes the HF 5.24 default id.
    """
    return {
        k: cf.optional_int(raw, k, where, maximum=cf.MAX_TOKEN_ID) if k in raw else d
        for k, d in _MM_DEFAULTS.items()
    }


def read_config(model_type: str, raw: Mapping[str, Any]) -> Gemma4Config:
    """Read ``config.json`` of a ``gemma4`` or ``gemma4_text`` checkpoint."""
    if model_type == "gemma4_text":
        return Gemma4Config(model_type=model_type, text=read_text_config(raw), raw=raw)
    if model_type != "gemma4":
        raise cf.fail(
            f"mobius-gemma4 cannot read model_type {cf.show(model_type)}",
            "config.json.model_type",
            f"supported: {', '.join(MODEL_TYPES)}",
        )
    if not isinstance(raw, Mapping):
        raise cf.fail("config.json must hold a JSON object", "config.json", "fix config.json")
    where = "config.json"
    text = dict(cf.mapping(raw, "text_config", where) or {})
    # HF Gemma4Config's own tie_word_embeddings governs the head of the multimodal model.
    if "tie_word_embeddings" in raw:
        text["tie_word_embeddings"] = raw["tie_word_embeddings"]
    ids = read_media_token_ids(raw, where)
    from mobius_gemma4.audio.config import read_audio_config
    from mobius_gemma4.vision.config import read_vision_config

    return Gemma4Config(
        model_type=model_type,
        text=read_text_config(text, cf.path(where, "text_config")),
        vision=read_section(raw, "vision_config", read_vision_config),
        audio=read_section(raw, "audio_config", read_audio_config),
        raw=raw,
        **ids,
    )


def read_section(raw: Mapping[str, Any], key: str, reader) -> Any:
    """``reader(raw[key], where=...)``, or None when the section is null or absent."""
    section = cf.mapping(raw, key, "config.json")
    return None if section is None else reader(section, where="config.json")
