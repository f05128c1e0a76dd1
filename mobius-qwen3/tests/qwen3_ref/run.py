"""Running a built package only through ``mobius_runtime.Pipeline`` (the runtime's executor)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def load_pipeline(package: Path):
    from mobius_runtime import Pipeline

    return Pipeline.load(package, device="cpu", threads=1)


def step_logits(pipeline, ids: np.ndarray, prompt_len: int) -> np.ndarray:
    """Prefill ``ids[:, :prompt_len]``, then one cached step per remaining id; ``[B, T, V]``."""
    outs, state = pipeline.step(input_ids=ids[:, :prompt_len])
    chunks = [outs["logits"].astype(np.float32)]
    for s in range(prompt_len, ids.shape[1]):
        step, state = pipeline.step(state, input_ids=ids[:, s : s + 1])
        chunks.append(step["logits"].astype(np.float32))
    return np.concatenate(chunks, axis=1)


def top1(ref: np.ndarray, got: np.ndarray, tie: float = 0.0) -> tuple[float, float]:
    """(strict top-1 agreement, tie-aware agreement): a differing pick counts as a tie
    when its reference logit is within ``tie`` of the reference maximum."""
    r = ref.reshape(-1, ref.shape[-1])
    g = got.reshape(-1, got.shape[-1])
    strict = r.argmax(-1) == g.argmax(-1)
    picked = r[np.arange(len(g)), g.argmax(-1)]
    return float(strict.mean()), float((strict | (picked >= r.max(-1) - tie)).mean())
