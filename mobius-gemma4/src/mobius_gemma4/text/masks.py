"""Boolean attention masks of the text decoder (docs/gemma4.md §4), built in the graph.

Query ``i`` sits at cache index ``P + i`` (``P = total − S``), key ``j`` at ``j``.
Full layers: ``j ≤ P + i``; sliding layers additionally ``j > P + i − W`` (W keys
including self). Both exclude keys where ``attention_mask == 0``. The result is
``[batch, 1, S, total]`` bool, True = attend, as ONNX ``Attention`` takes it.

``use_bidirectional_attention = "vision"`` (HF 5.24 ``create_masks_for_vision_model``):
full layers stay causal; sliding layers become ``(causal ∨ same_block) ∧ window``, the
window applied after the OR. Block ids come from the step's ``input_ids``
(:func:`image_block_ids`): each maximal run of image/video placeholders gets 0, 1, …,
everything else −1; past keys are −1, so decode steps are plain causal as in HF.

``gemma4_unified`` (HF 5.24 ``Gemma4UnifiedModel.forward`` → ``create_masks_for_generate``
with ``block_sequence_ids``): the overlay is on every layer and ORed last — full layers
``causal ∨ same_block``, sliding layers ``(causal ∧ window) ∨ same_block`` (an image block
longer than W keeps all its keys). Selected by ``overlay_full_layers``.
"""

from __future__ import annotations

import onnx_ir as ir

INT64 = ir.DataType.INT64


def image_block_ids(op, input_ids, token_ids: tuple[int, ...]):
    """``[B, S]`` int64 block id of every position: runs of ``token_ids`` → 0, 1, …; else −1."""
    hit = None
    for t in token_ids:
        eq = op.Equal(input_ids, op.Constant(value_int=t))
        hit = eq if hit is None else op.Or(hit, eq)
    v = op.Cast(hit, to=INT64)
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    first = op.Mul(op.Slice(v, zero, one, one), op.Constant(value_int=0))  # [B, 1] zeros
    prev = op.Concat(first, op.Slice(v, zero, op.Constant(value_ints=[-1]), one), axis=1)
    starts = op.Mul(v, op.Sub(op.Constant(value_int=1), prev))
    group = op.Sub(op.CumSum(starts, op.Constant(value_int=1)), op.Constant(value_int=1))
    return op.Where(hit, group, op.Constant(value_int=-1))


def _same_block(op, blocks, past):
    """``[B, 1, S, T]``: query and key in the same image block (past keys are −1)."""
    batch = op.Shape(blocks, start=0, end=1)
    past_ids = op.ConstantOfShape(
        op.Concat(batch, past, axis=0),
        value=ir.tensor([-1], dtype=INT64),
    )
    keys = op.Unsqueeze(op.Concat(past_ids, blocks, axis=1), [1, 2])  # [B, 1, 1, T]
    queries = op.Unsqueeze(blocks, [1, 3])  # [B, 1, S, 1]
    in_block = op.GreaterOrEqual(queries, op.Constant(value_int=0))
    return op.And(op.Equal(queries, keys), in_block)


def build_masks(
    op, attention_mask, seq_len, window: int, image_blocks=None, *, overlay_full_layers=False
):
    """Return ``(full_mask, sliding_mask)`` from the 2-D int64 ``attention_mask``.

    ``seq_len`` is a 1-element int64 tensor holding S; ``image_blocks`` the ``[B, S]``
    ids of :func:`image_block_ids` for the ``"vision"`` overlay (None: plain causal);
    ``overlay_full_layers`` selects the ``gemma4_unified`` composition (module doc).
    """
    total = op.Shape(attention_mask, start=1, end=2)
    past = op.Sub(total, seq_len)
    q_pos = op.Range(op.Squeeze(past, [0]), op.Squeeze(total, [0]), 1)
    k_pos = op.Range(0, op.Squeeze(total, [0]), 1)
    q_col = op.Unsqueeze(q_pos, [1])  # [S, 1]
    k_row = op.Unsqueeze(k_pos, [0])  # [1, T]
    causal = op.LessOrEqual(k_row, q_col)  # [S, T]
    in_window = op.Greater(k_row, op.Sub(q_col, window))
    keep = op.Unsqueeze(op.Not(op.Equal(attention_mask, 0)), [1, 2])  # [B, 1, 1, T]
    full = op.And(keep, causal)
    if image_blocks is not None and overlay_full_layers:
        same = _same_block(op, image_blocks, past)  # [B, 1, S, T]
        full = op.And(keep, op.Or(causal, same))
        sliding = op.And(keep, op.Or(op.And(causal, in_window), same))
    elif image_blocks is None:
        sliding = op.And(keep, op.And(causal, in_window))
    else:
        visible = op.Or(causal, _same_block(op, image_blocks, past))  # [B, 1, S, T]
        sliding = op.And(keep, op.And(visible, in_window))
    return full, sliding
