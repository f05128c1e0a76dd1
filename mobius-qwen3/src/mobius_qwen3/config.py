"""Typed, frozen Qwen3 / Qwen3-MoE configs read from raw ``config.json`` (never transformers).

The fields every decoder shares come from :func:`mobius.lm.config.read_decoder` (both
rope shapes, rope types ``default``, ``linear``, ``yarn``, ``llama3``). Missing keys take
the defaults of HF transformers 5.24 (``Qwen3Config``, ``Qwen3MoeConfig``), which differ
between the two model types (hidden 4096 vs 2048, head_dim 128 vs ``hidden // heads``, ...).

Layer geometry, as HF: ``sliding_window`` counts only with ``use_sliding_window``;
qwen3 slides on ``layer_types`` entries ``sliding_attention`` (default: layers
``i >= max_window_layers``), qwen3_moe on every layer. A qwen3_moe layer is sparse when it
is not in ``mlp_only_layers``, ``num_experts > 0`` and ``(i + 1) % decoder_sparse_step == 0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mobius import config_fields as cf
from mobius.lm.config import FULL, SLIDING, DecoderConfig, read_decoder, read_layer_types

QWEN3, QWEN3_MOE = "qwen3", "qwen3_moe"
MODEL_TYPES = (QWEN3, QWEN3_MOE)
__all__ = ["FULL", "MODEL_TYPES", "SLIDING", "Qwen3Config", "read_config"]

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
class Qwen3Config(DecoderConfig):
    sparse_layers: tuple[bool, ...]
    """Per layer: routed experts (qwen3_moe) instead of the dense MLP."""
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False

    @property
    def is_moe(self) -> bool:
        return any(self.sparse_layers)


def _moe(raw: Mapping[str, Any], layers: int, where: str) -> dict[str, Any]:
    d = _DEFAULTS[QWEN3_MOE]
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
    only = cf.int_list(raw, "mlp_only_layers", where, maximum=cf.MAX_LAYERS) or ()
    step = cf.positive_int(raw, "decoder_sparse_step", 1, where, maximum=cf.MAX_LAYERS)
    return {
        "sparse_layers": tuple(
            i not in only and experts > 0 and (i + 1) % step == 0 for i in range(layers)
        ),
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": cf.positive_int(
            raw, "moe_intermediate_size", d["moe_intermediate_size"], where
        ),
        "norm_topk_prob": cf.boolean(raw, "norm_topk_prob", False, where),
    }


def read_config(model_type: str, raw: Mapping[str, Any], where: str = "config.json") -> Qwen3Config:
    """The typed config of a ``qwen3`` or ``qwen3_moe`` checkpoint (ConfigError on bad values)."""
    fields = read_decoder(
        model_type,
        raw,
        where,
        family="Qwen3",
        defaults=_DEFAULTS[model_type],
        bias_keys=("attention_bias",),
    )
    layers = fields["num_hidden_layers"]
    use_window = cf.boolean(raw, "use_sliding_window", False, where)
    window = cf.positive_int(raw, "sliding_window", 4096, where, maximum=cf.MAX_POSITIONS)
    window = window if use_window else None
    if model_type == QWEN3_MOE:
        kinds = (SLIDING if window is not None else FULL,) * layers
        moe = _moe(raw, layers, where)
    else:
        first = cf.nonneg_int(raw, "max_window_layers", 28, where, maximum=cf.MAX_LAYERS)
        default = [SLIDING if i >= first else FULL for i in range(layers)]
        kinds = read_layer_types(raw, layers, window, where, default=default)
        moe = {"sparse_layers": (False,) * layers}
    return Qwen3Config(**fields, layer_types=kinds, sliding_window=window, **moe)
