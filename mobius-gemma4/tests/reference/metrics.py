"""Top-1 agreement for half-precision parity (docs/gemma4.md §13 bars).

A random tiny model has near-ties that an f16 / bf16 build cannot resolve: a position
whose reference top-1/top-2 margin is inside the dtype's noise (``TIE``) counts as
agreeing when the package's pick is within that margin of the reference maximum.
"""

from __future__ import annotations

import numpy as np

TIE = {"f16": 0.02, "bf16": 0.1}
"""Reference margin below which a differing half-precision top-1 is a tie, not a miss."""


def top1(ref: np.ndarray, got: np.ndarray, tie: float = 0.0) -> tuple[float, float]:
    """(strict top-1 agreement, tie-aware agreement) over all positions."""
    r = ref.reshape(-1, ref.shape[-1])
    g = got.reshape(-1, got.shape[-1])
    ra, ga = r.argmax(-1), g.argmax(-1)
    strict = ra == ga
    picked = r[np.arange(len(ga)), ga]
    tied = picked >= r.max(-1) - tie
    return float(strict.mean()), float((strict | tied).mean())
