"""Choosing the next token from the last position's logits, in numpy.

Greedy is ``argmax``. Sampling applies temperature, then top-k, then top-p
(nucleus) to the softmax in float64, and draws with a ``numpy.random.Generator``
seeded by the caller, so a seed reproduces the same ids.

Every accepted setting is numerically safe. The logits are shifted by their maximum
*before* the temperature divides them, so every scaled value is <= 0 and the best token
is exactly 0: a subnormal temperature (``1e-310``) sends the others to ``-inf``
(probability 0: greedy, as the limit is) instead of overflowing to ``inf - inf = NaN``;
a huge one flattens them towards uniform. The best token always survives top-k and
top-p, so the kept mass is >= 1 before it is normalised and never 0. ``top_k`` larger
than the vocabulary keeps everything; ``top_p`` at its smallest keeps the best token.
Logits whose maximum is NaN or infinite are refused (the engine and ``generate`` check
them first and end only that request).
"""

from __future__ import annotations

import math

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
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(
            f"temperature must be a finite number > 0 when sampling, got {temperature}"
        )
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    top = float(np.max(row))
    if not np.isfinite(top):
        raise ValueError(f"cannot sample from logits whose maximum is {top}")
    rng = rng or np.random.default_rng()
    # shift first, then scale: every value <= 0 and the best one exactly 0, so a tiny
    # temperature gives -inf (underflow to probability 0), never inf - inf
    with np.errstate(over="ignore", under="ignore"):
        scaled = (row - top) / temperature
    if top_k and 0 < top_k < row.size:
        # ranked on the logits, not the scaled values: a huge temperature may round
        # every scaled value to 0, and ties would keep the whole vocabulary
        kth = np.partition(row, -top_k)[-top_k]
        scaled = np.where(row >= kth, scaled, -np.inf)
    with np.errstate(under="ignore"):
        probs = np.exp(scaled)
    if top_p < 1.0:
        probs /= probs.sum()
        order = np.argsort(-row, kind="stable")  # most likely first, ties by logit
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
