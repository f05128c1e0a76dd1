"""Boolean attention masks of the text decoder (reference §4), built in the graph.

Query ``i`` sits at cache index ``P + i`` (``P = total − S``), key ``j`` at ``j``.
Full layers: ``j ≤ P + i``; sliding layers additionally ``j > P + i − W`` (W keys
including self). Both exclude keys where ``attention_mask == 0``. Text-only prompts use
these plain causal masks for ``use_bidirectional_attention = "vision"`` too; the image
block overlay is the vision issue's. The result is ``[batch, 1, S, total]`` bool, True =
attend, as ONNX ``Attention`` takes it.
"""

from __future__ import annotations

import onnx_ir as ir

INT64 = ir.DataType.INT64


def build_masks(op, attention_mask, seq_len, window: int):
    """Return ``(full_mask, sliding_mask)`` from the 2-D int64 ``attention_mask``.

    ``seq_len`` is a 1-element int64 tensor holding S.
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
    sliding = op.And(keep, op.And(causal, in_window))
    return full, sliding
