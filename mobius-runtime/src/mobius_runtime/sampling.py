"""How a request samples and stops (:class:`SamplingParams`), and choosing the next
token from the last position's logits, in numpy.

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mobius_runtime.errors import RequestError
from mobius_runtime.requests import check_sampling


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


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks and stops: the one settings type of ``generate``,
    :class:`~mobius_runtime.session.ChatSession`, ``mobius run`` / ``chat`` and ``mobius serve``.

    ``temperature == 0`` is greedy (then ``top_k``, ``top_p`` and ``seed`` do nothing);
    ``top_k`` 0 is off. Generation ends at one of ``stop_ids`` (None: the family's stop
    ids), when the text holds one of the ``stop`` strings (the text is cut where the
    earliest begins), after ``max_tokens`` tokens, or at the model's context length.
    Checked when built, by the rules of :func:`~mobius_runtime.requests.check_sampling`.
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < 1
        ):
            raise RequestError(
                f"max_tokens must be at least 1, got {self.max_tokens!r}",
                where="max_tokens",
                fix="pass a positive number",
            )
        greedy = isinstance(self.temperature, (int, float)) and self.temperature == 0
        check_sampling(not greedy, self.temperature, self.top_k, self.top_p, self.seed)
        if not isinstance(self.stop, (tuple, list)) or not all(
            isinstance(s, str) for s in self.stop
        ):
            raise RequestError(
                f"stop must be a sequence of strings, got {self.stop!r}",
                where="stop",
                fix='e.g. stop=("\\n\\n",)',
            )
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.stop_ids is not None:
            object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))

    @classmethod
    def from_options(
        cls,
        max_tokens: int,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_ids: Iterable[int] | None = None,
        stop: Sequence[str] = (),
    ) -> SamplingParams:
        """The params of HF-style keyword arguments (``do_sample=False`` is greedy whatever
        the temperature; every setting is still checked)."""
        check_sampling(do_sample, temperature, top_k, top_p, seed)
        return cls(
            max_tokens=max_tokens,
            temperature=temperature if do_sample else 0.0,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop=stop if isinstance(stop, str) else tuple(stop),  # a str is refused
            stop_ids=None if stop_ids is None else tuple(stop_ids),
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """:class:`SamplingParams` with the random state of one request (or one conversation)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = None if params.greedy else np.random.default_rng(params.seed)

    def pick(self, logits: np.ndarray) -> int:
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        return pick(
            logits,
            do_sample=True,
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            rng=self.rng,
        )
