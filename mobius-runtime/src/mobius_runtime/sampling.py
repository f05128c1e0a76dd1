"""Choosing the next token from the last position's logits, in numpy.

Greedy is ``argmax``. Sampling applies temperature, then top-k, then top-p
(nucleus) to the softmax in float64, and draws with a ``numpy.random.Generator``
seeded by the caller, so a seed reproduces the same ids.
"""

from __future__ import annotations

import numpy as np


def pick(
    logits: np.ndarray,
    *,
    do_sample: bool,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rng: np.random.Generator | None = None,
) -> int:
    """The next token id for a 1-D row of logits."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    if not do_sample:
        return int(np.argmax(row))
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    rng = rng or np.random.default_rng()
    row = row / temperature
    if top_k and 0 < top_k < row.size:
        kth = np.partition(row, -top_k)[-top_k]
        row = np.where(row >= kth, row, -np.inf)
    probs = np.exp(row - np.max(row))
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = int(np.searchsorted(cumulative, top_p)) + 1
        mask = np.zeros_like(probs, dtype=bool)
        mask[order[:keep]] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    return int(rng.choice(probs.size, p=probs))


class Sampler:
    """Greedy or seeded sampling with fixed settings for one request."""

    def __init__(
        self, do_sample: bool, temperature: float, top_k: int, top_p: float, seed: int | None
    ) -> None:
        self.do_sample = do_sample
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.rng = np.random.default_rng(seed) if do_sample else None

    def pick(self, logits: np.ndarray) -> int:
        if not self.do_sample:
            return int(np.argmax(logits))
        return pick(
            logits,
            do_sample=True,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            rng=self.rng,
        )
