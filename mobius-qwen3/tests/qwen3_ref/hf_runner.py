"""Qwen3-MoE's own reference figure: router margins (the rest: mobius_testing.lm_parity)."""

from __future__ import annotations

import numpy as np


def route_margins(model, ids: np.ndarray, top_k: int) -> np.ndarray | None:
    """Per position, the smallest float32 router margin over the sparse layers: the k-th
    minus the (k+1)-th softmax probability (``None`` for a dense model). A margin inside a
    half-precision build's noise may pick another expert there, changing that position's
    logits legitimately (HF's own half-precision forward can flip it too)."""
    import torch

    with torch.no_grad():
        t = torch.from_numpy(ids.astype(np.int64))
        out = model(input_ids=t, output_router_logits=True, use_cache=False)
    logits = getattr(out, "router_logits", None)
    if not logits:
        return None
    margins = []
    for layer in logits:
        probs = torch.sort(torch.softmax(layer.float(), -1), -1, descending=True).values
        margins.append((probs[:, top_k - 1] - probs[:, top_k]).numpy())
    return np.min(np.stack(margins), axis=0).reshape(ids.shape)
