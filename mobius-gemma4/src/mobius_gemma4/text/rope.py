"""Rotary position embedding of Gemma 4: default (sliding) and proportional (full) RoPE.

Frequencies come from :func:`mobius.components.rope_inv_freq`, which computes HF 5.24's
``default`` and ``proportional`` tables bit for bit: proportional rotates
``int(p·hd/2)`` pairs with the *full* head dim as exponent denominator, zero-pads to
``hd/2`` and divides by ``factor``. Zero frequencies give cos = 1, sin = 0, so the whole
head is rotated by ONNX ``RotaryEmbedding`` (split-half, no partial dim) and the padded
dims pass through unchanged.

cos/sin are formed in the graph from ``position_ids`` (:func:`mobius.components.rotary_cos_sin`:
float32 ``pos · inv_freq`` as HF's rotary module does, cast to the compute dtype), which
avoids storing ``[max_position_embeddings, hd/2]`` tables (hundreds of MB for 262144
positions).
"""

from __future__ import annotations

import onnx_ir as ir

from mobius.components import rope_inv_freq, rotary_cos_sin
from mobius_gemma4.config import Gemma4TextConfig


def cos_sin(op, cfg: Gemma4TextConfig, layer_type: str, position_ids, dtype: ir.DataType):
    """``(cos, sin)`` of shape ``[batch, seq, hd/2]`` in ``dtype`` for one layer type."""
    p = cfg.rope_parameters[layer_type]
    params = {
        "rope_type": p.rope_type,
        "rope_theta": p.rope_theta,
        "partial_rotary_factor": p.partial_rotary_factor,
        "factor": p.factor,
    }
    inv_freq, scaling = rope_inv_freq(params, cfg.layer_type_dim(layer_type))
    return rotary_cos_sin(
        op, inv_freq, position_ids, dtype, scaling=scaling, name=f"rope.{layer_type}"
    )
