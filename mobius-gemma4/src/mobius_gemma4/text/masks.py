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

from mobius.components import allowed_positions

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


def _same_block(op, blocks, query, attention_mask):
    """``[B, 1, S, T]``: query and key in the same image block (past keys are −1)."""
    total = op.Shape(attention_mask, start=1, end=2)
    past = op.Sub(total, op.Shape(query, start=1, end=2))
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
    op, attention_mask, query, window: int, image_blocks=None, *, overlay_full_layers=False
):
    """Return ``(full_mask, sliding_mask)`` from the 2-D int64 ``attention_mask``.

    ``query`` is the step's hidden states (axis 1 = S); ``image_blocks`` the ``[B, S]``
    ids of :func:`image_block_ids` for the ``"vision"`` overlay (None: plain causal);
    ``overlay_full_layers`` selects the ``gemma4_unified`` composition (module doc). The
    causal, window and padding rules are :func:`mobius.components.allowed_positions`;
    the image-block pairs go in as its ``also``.
    """
    same = None
    if image_blocks is not None:
        same = _same_block(op, image_blocks, query, attention_mask)
    full_extra = same if overlay_full_layers else None
    full = allowed_positions(op, attention_mask, query, also=full_extra)
    sliding = allowed_positions(
        op,
        attention_mask,
        query,
        sliding_window=window,
        also=same,
        also_within_window=not overlay_full_layers,
    )
    return full, sliding
