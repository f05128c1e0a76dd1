"""Row-level graph pieces of multimodal LMs: placeholder tokens and variable-length rows.

A multimodal prompt holds runs of placeholder tokens (one per encoder soft token); the
encoders emit their soft tokens as ``[rows, H]`` tables whose length depends on the
media. These helpers express that without control flow:

- :func:`token_in`: where ids are any of a few token ids;
- :func:`map_placeholders`: placeholders replaced by another id before a table lookup;
- :func:`scatter_rows`: row ``k`` of a table into the ``k``-th placeholder position
  (HF's ``masked_scatter``);
- :func:`keep_rows`: the rows a mask keeps, flattened batch-major (``Compress``, run on
  float32: onnxruntime has no bfloat16 ``Compress``).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript import OpBuilder

_F32, _INT64 = ir.DataType.FLOAT, ir.DataType.INT64


def token_in(op: OpBuilder, ids: ir.Value, token_ids: Sequence[int]) -> ir.Value:
    """Bool, ids' shape: the id is one of ``token_ids`` (at least one)."""
    hit = None
    for t in token_ids:
        eq = op.Equal(ids, op.Constant(value_int=int(t)))
        hit = eq if hit is None else op.Or(hit, eq)
    if hit is None:
        raise ValueError("token_in: give at least one token id")
    return hit


def map_placeholders(op: OpBuilder, ids: ir.Value, placeholder_ids: Sequence[int], pad: int):
    """``where(ids ∈ placeholder_ids, pad, ids)``; ``ids`` unchanged when there are none."""
    if not placeholder_ids:
        return ids
    return op.Where(token_in(op, ids, placeholder_ids), op.Constant(value_int=int(pad)), ids)


def scatter_rows(
    op: OpBuilder, embeds: ir.Value, ids: ir.Value, token: int, rows: ir.Value, hidden: int
) -> ir.Value:
    """HF ``masked_scatter``: row ``k`` of ``rows [R, hidden]`` replaces ``embeds [B, S,
    hidden]`` at the ``k``-th position (batch-major) where ``ids == token``; the other
    positions keep ``embeds``. A zero row is appended so the Gather never reads an empty
    table (decode steps get ``[0, hidden]``)."""
    hit = op.Equal(ids, op.Constant(value_int=int(token)))  # [B, S]
    flat = op.Reshape(op.Cast(hit, to=_INT64), op.Constant(value_ints=[-1]))
    index = op.Sub(op.CumSum(flat, op.Constant(value_int=0)), op.Constant(value_int=1))
    index = op.Max(index, op.Constant(value_int=0))
    zero_row = op.CastLike(
        op.ConstantOfShape(op.Constant(value_ints=[1, hidden])), embeds
    )  # ConstantOfShape defaults to float32 zeros
    table = op.Concat(op.CastLike(rows, embeds), zero_row, axis=0)
    placed = op.Reshape(op.Gather(table, index, axis=0), op.Shape(embeds))
    return op.Where(op.Unsqueeze(hit, [2]), placed, embeds)


def keep_rows(op: OpBuilder, x: ir.Value, keep: ir.Value, width: int) -> ir.Value:
    """Float32 ``[K, width]``: the rows of ``x [..., width]`` where the bool ``keep`` (x's
    leading shape) is true, flattened batch-major. Always float32 (onnxruntime has no
    bfloat16 ``Compress``): the caller casts back where its tensor is in the model dtype."""
    x32 = x if x.dtype == _F32 else op.Cast(x, to=_F32)
    rows = op.Reshape(x32, op.Constant(value_ints=[-1, width]))
    return op.Compress(rows, op.Reshape(keep, op.Constant(value_ints=[-1])), axis=0)
