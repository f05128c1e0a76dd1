"""HF transformers 5.24 on CPU, float32, eager attention: logits and greedy ids.

The reference for a prefill of ``P`` tokens followed by ``N`` single-token decode steps
is one causal no-cache forward over all ``P + N`` tokens: position ``t`` of it sees
tokens ``0..t``, exactly what the package sees at that position after a cached prefill
and ``t - P`` cached steps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def load_model(folder: Path, model_type: str):
    import torch

    from qwen3_ref.fixtures import model_class

    model = model_class(model_type).from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        t = torch.from_numpy(ids.astype(np.int64))
        out = model(input_ids=t, attention_mask=torch.ones_like(t), use_cache=False)
    return out.logits.float().numpy()


def hf_greedy(model, prompt: np.ndarray, new_tokens: int) -> list[int]:
    """``generate`` with HF's own KV cache, greedy, no stop id: ``new_tokens`` ids."""
    import torch

    with torch.no_grad():
        t = torch.from_numpy(prompt.astype(np.int64))
        out = model.generate(
            input_ids=t,
            attention_mask=torch.ones_like(t),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, t.shape[1] :].tolist()


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
