"""Shared graph components (``onnxscript.nn.Module`` subclasses) and graph helpers.

Both families (Gemma 4 and Qwen3) build their graphs from these pieces, so numerics
that are easy to get wrong (float32 RMSNorm accumulation, rotary layout, KV-cache
layout) are written and tested once. One documented signature each (the docstrings
pin constructor and ``forward(op, ...)``; docs/internals.md; for how a family uses
them, docs/writing-a-plugin.md §6 "A second real family"):

- ``Linear`` (optional bias), ``linear_transposed`` (a ``[out, in]`` head, tied or not),
  ``Embedding``, ``ScaledEmbedding`` / ``embed_scale`` (Gemma's ``sqrt(hidden)``),
  ``logit_softcap``;
- ``RMSNorm`` (with / without weight, ``1 + w`` via ``weight_offset``, Llama/Qwen weight
  order via ``weight_after_cast``; ``fused`` / ``fused_rmsnorm_available``: onnxruntime's
  fused norm ops on ``--target cpu``), ``LayerNorm`` (float32);
- ``rope_inv_freq`` (HF rope types incl. partial rotary), ``rotary_cos_sin`` (in-graph
  cos/sin), ``apply_rotary``; ``RotaryEmbedding`` / ``rotary_tables`` (build-time tables);
- ``allowed_positions`` (causal / sliding / padding, plus a family overlay),
  ``additive_attention_mask``, ``gqa_lengths``; ``block_ids`` / ``same_block`` (the
  image-block overlay: bidirectional attention inside each run of image placeholders);
- multimodal rows: ``token_in``, ``map_placeholders``, ``scatter_rows`` (HF's
  ``masked_scatter``), ``keep_rows`` (float32 ``Compress`` of the rows a mask keeps);
- ``Attention``, ``GroupQueryAttention``, ``gqa_available`` / ``GQA_DTYPES``;
- ``GatedMLP`` and ``activation``; ``route`` + ``RoutedExperts`` (routed MoE);
- graph helpers ``new_graph`` / ``add_input`` / ``add_output`` / ``constant`` /
  ``finish_model`` and dtype names.

Family-specific blocks (Gemma 4's per-layer embeddings and clipped linears; Qwen3's
sparse-layer choice) stay in the families.
"""

from __future__ import annotations

from mobius.components.attention import GQA_DTYPES, Attention, GroupQueryAttention, gqa_available
from mobius.components.dtypes import DTYPE_NAMES, dtype_name, ir_dtype, numpy_dtype
from mobius.components.embedding import Embedding, ScaledEmbedding, embed_scale
from mobius.components.experts import RoutedExperts, route
from mobius.components.graph import (
    MS_DOMAIN,
    add_input,
    add_output,
    constant,
    finish_model,
    ms_opset,
    new_graph,
)
from mobius.components.linear import Linear, linear_transposed
from mobius.components.masks import (
    additive_attention_mask,
    allowed_positions,
    block_ids,
    gqa_lengths,
    same_block,
)
from mobius.components.mlp import ACTIVATIONS, GatedMLP, activation
from mobius.components.norm import FUSED_NORM_TARGETS, LayerNorm, RMSNorm, fused_rmsnorm_available
from mobius.components.rotary import (
    ROPE_TYPES,
    RotaryEmbedding,
    apply_rotary,
    rope_inv_freq,
    rotary_cos_sin,
    rotary_tables,
)
from mobius.components.rows import keep_rows, map_placeholders, scatter_rows, token_in
from mobius.components.softcap import logit_softcap

__all__ = [
    "ACTIVATIONS",
    "DTYPE_NAMES",
    "FUSED_NORM_TARGETS",
    "GQA_DTYPES",
    "MS_DOMAIN",
    "ROPE_TYPES",
    "Attention",
    "Embedding",
    "GatedMLP",
    "GroupQueryAttention",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "RotaryEmbedding",
    "RoutedExperts",
    "ScaledEmbedding",
    "activation",
    "add_input",
    "add_output",
    "additive_attention_mask",
    "allowed_positions",
    "apply_rotary",
    "block_ids",
    "constant",
    "dtype_name",
    "embed_scale",
    "finish_model",
    "fused_rmsnorm_available",
    "gqa_available",
    "gqa_lengths",
    "ir_dtype",
    "keep_rows",
    "linear_transposed",
    "logit_softcap",
    "map_placeholders",
    "ms_opset",
    "new_graph",
    "numpy_dtype",
    "rope_inv_freq",
    "rotary_cos_sin",
    "rotary_tables",
    "route",
    "same_block",
    "scatter_rows",
    "token_in",
]
