"""Rotary position embedding of Gemma 4: default (sliding) and proportional (full) RoPE.

``inv_freq`` is computed in numpy exactly as HF 5.24 does (docs/gemma4.md §3.3):
default ``θ^(−2j/hd)`` over the whole head; proportional ``θ^(−2j/hd)`` for
``j < int(p·hd/2)`` — the exponent denominator is the *full* head dim — zero-padded to
``hd/2`` and divided by ``factor``. Zero frequencies give cos = 1, sin = 0, so the
whole head is rotated with ONNX ``RotaryEmbedding`` (split-half, no partial dim) and
the padded dims pass through unchanged.

cos/sin are formed in the graph from ``position_ids`` in float32 (``pos · inv_freq``,
as HF's rotary module does) and cast to the compute dtype, which avoids storing
``[max_position_embeddings, hd/2]`` tables (hundreds of MB for 262144 positions).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_gemma4.config import Gemma4TextConfig, RopeParams


def inv_freq(params: RopeParams, head_dim: int) -> np.ndarray:
    """``inv_freq`` of length ``head_dim / 2`` (float32), HF 5.24 semantics."""
    base = float(params.rope_theta)
    if params.rope_type == "default":
        exps = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        return (1.0 / (np.float32(base) ** exps)).astype(np.float32)
    if params.rope_type == "proportional":
        angles = int(params.partial_rotary_factor * head_dim // 2)
        exps = np.arange(0, 2 * angles, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        rotated = (1.0 / (np.float32(base) ** exps)).astype(np.float32)
        out = np.zeros(head_dim // 2, dtype=np.float32)
        out[:angles] = rotated
        return (out / np.float32(params.factor)).astype(np.float32)
    raise ValueError(f"unknown rope_type {params.rope_type!r}")  # config reading rejects it first


def cos_sin(op, cfg: Gemma4TextConfig, layer_type: str, position_ids, dtype: ir.DataType):
    """``(cos, sin)`` of shape ``[batch, seq, hd/2]`` in ``dtype`` for one layer type."""
    hd = cfg.layer_type_dim(layer_type)
    freq = inv_freq(cfg.rope_parameters[layer_type], hd)
    freq_v = op.initializer(ir.tensor(freq, name=f"rope.{layer_type}.inv_freq"))
    pos = op.Unsqueeze(op.Cast(position_ids, to=ir.DataType.FLOAT), [-1])
    angles = op.Mul(pos, freq_v)
    cos, sin = op.Cos(angles), op.Sin(angles)
    if dtype != ir.DataType.FLOAT:
        cos, sin = op.Cast(cos, to=dtype), op.Cast(sin, to=dtype)
    return cos, sin
