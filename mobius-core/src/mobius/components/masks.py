"""Attention masks built inside the graph from the runtime's ``attention_mask``.

The runtime feeds ``attention_mask`` ``[B, T]`` (1 = real token, 0 = padding) covering
past and current tokens. Query row ``i`` of the current step sits at cache position
``T - S + i``; it may see key ``j`` when ``j <= T - S + i`` (causal), the key is not
padding, and — for sliding-window layers with HF ``sliding_window`` W —
``(T - S + i) - j < W``. Family-specific rules (bidirectional image spans, …) belong in
the family's plugin, which passes them in as ``also``: an extra bool ``[B, 1, S, T]`` of
pairs allowed besides causality, ORed either before the window (the window still
applies) or after it (``also_within_window=False``: the extra pairs bypass the window).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius.components.dtypes import ir_dtype, numpy_dtype
from mobius.components.graph import constant
from mobius.components.rows import token_in

_INT64 = ir.DataType.INT64


def _shared_constant(op: OpBuilder, array: np.ndarray, name: str) -> ir.Value:
    """A graph-wide constant named ``name``, created on first use and reused afterwards."""
    existing = op.builder.root.graph.initializers.get(name)
    if existing is not None:
        return existing
    return constant(op, array, name, qualify=False)


def _dim(op: OpBuilder, x: ir.Value, axis: int) -> ir.Value:
    """Scalar int64 size of ``x`` along ``axis``."""
    return op.Squeeze(op.Shape(x, start=axis, end=axis + 1), [0])


def allowed_positions(
    op: OpBuilder,
    attention_mask: ir.Value,
    query: ir.Value,
    *,
    sliding_window: int | None = None,
    also: ir.Value | None = None,
    also_within_window: bool = True,
) -> ir.Value:
    """Bool ``[B, 1, S, T]``: True where query ``i`` may attend key ``j``.

    ``attention_mask`` int ``[B, T]``; ``query`` is any value whose axis 1 is the current
    step length ``S`` (``input_ids`` or hidden states). ``also`` (bool, broadcastable to
    ``[B, 1, S, T]``) allows more pairs: ``(causal ∨ also) ∧ window`` by default,
    ``(causal ∧ window) ∨ also`` with ``also_within_window=False``. Padding keys
    (``attention_mask == 0``) are never allowed.
    """
    total = _dim(op, attention_mask, 1)
    steps = _dim(op, query, 1)
    kv_idx = op.Range(0, total, 1)  # [T]
    q_idx = op.Range(op.Sub(total, steps), total, 1)  # [S]
    q_col = op.Unsqueeze(q_idx, [1])  # [S, 1]
    kv_row = op.Unsqueeze(kv_idx, [0])  # [1, T]
    allowed = op.LessOrEqual(kv_row, q_col)  # [S, T]
    window = None
    if sliding_window is not None:
        window = op.Greater(kv_row, op.Sub(q_col, int(sliding_window)))
    if also is not None and also_within_window:
        allowed = op.Or(allowed, also)  # [B, 1, S, T]
    if window is not None:
        allowed = op.And(allowed, window)
    if also is not None and not also_within_window:
        allowed = op.Or(allowed, also)
    keep = op.Unsqueeze(op.Cast(attention_mask, to=ir.DataType.BOOL), [1, 2])  # [B, 1, 1, T]
    if also is None:
        allowed = op.Unsqueeze(allowed, [0, 1])
    return op.And(allowed, keep)


def additive_attention_mask(
    op: OpBuilder,
    attention_mask: ir.Value,
    query: ir.Value,
    *,
    sliding_window: int | None = None,
    dtype: str | ir.DataType = "float32",
) -> ir.Value:
    """Additive float mask ``[B, 1, S, T]`` in ``dtype``: 0 where allowed, dtype's min elsewhere.

    The most negative finite value (not -inf) keeps fully padded query rows finite.
    Feed it to :class:`mobius.components.Attention` as ``mask``.
    """
    np_dtype = numpy_dtype(dtype)
    name = f"mask_fill_{ir_dtype(dtype).name.lower()}"
    zero = _shared_constant(op, np.zeros((), dtype=np_dtype), f"{name}_zero")
    low = np.array(ml_dtypes.finfo(np_dtype).min, dtype=np_dtype)
    fill = _shared_constant(op, low, f"{name}_min")
    allowed = allowed_positions(op, attention_mask, query, sliding_window=sliding_window)
    return op.Where(allowed, zero, fill)


def gqa_lengths(op: OpBuilder, attention_mask: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(seqlens_k, total_sequence_length)`` for GroupQueryAttention from ``attention_mask``.

    ``seqlens_k`` int32 ``[B]`` = number of ones per row − 1; ``total_sequence_length``
    int32 scalar = ``T``. (GroupQueryAttention assumes right padding.)
    """
    ones = op.ReduceSum(op.Cast(attention_mask, to=ir.DataType.INT64), [1], keepdims=0)
    seqlens_k = op.Cast(op.Sub(ones, 1), to=ir.DataType.INT32)
    total = op.Cast(_dim(op, attention_mask, 1), to=ir.DataType.INT32)
    return seqlens_k, total


def block_ids(op: OpBuilder, input_ids: ir.Value, token_ids: tuple[int, ...]) -> ir.Value:
    """``[B, S]`` int64 block id of every position: each maximal run of ``token_ids``
    (an image's placeholders) gets 0, 1, … in order; every other position −1."""
    hit = token_in(op, input_ids, token_ids)
    v = op.Cast(hit, to=_INT64)
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    first = op.Mul(op.Slice(v, zero, one, one), op.Constant(value_int=0))  # [B, 1] zeros
    prev = op.Concat(first, op.Slice(v, zero, op.Constant(value_ints=[-1]), one), axis=1)
    starts = op.Mul(v, op.Sub(op.Constant(value_int=1), prev))
    group = op.Sub(op.CumSum(starts, op.Constant(value_int=1)), op.Constant(value_int=1))
    return op.Where(hit, group, op.Constant(value_int=-1))


def same_block(
    op: OpBuilder, blocks: ir.Value, query: ir.Value, attention_mask: ir.Value
) -> ir.Value:
    """Bool ``[B, 1, S, T]``: query and key lie in the same block of :func:`block_ids`
    (bidirectional attention inside an image); past keys count as no block (−1), so a
    decode step is plain causal. Pass it to :func:`allowed_positions` as ``also``."""
    total = op.Shape(attention_mask, start=1, end=2)
    past = op.Sub(total, op.Shape(query, start=1, end=2))
    batch = op.Shape(blocks, start=0, end=1)
    past_ids = op.ConstantOfShape(
        op.Concat(batch, past, axis=0), value=ir.tensor([-1], dtype=_INT64)
    )
    keys = op.Unsqueeze(op.Concat(past_ids, blocks, axis=1), [1, 2])  # [B, 1, 1, T]
    queries = op.Unsqueeze(blocks, [1, 3])  # [B, 1, S, 1]
    in_block = op.GreaterOrEqual(queries, op.Constant(value_int=0))
    return op.And(op.Equal(queries, keys), in_block)
