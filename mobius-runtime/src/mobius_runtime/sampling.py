"""How a request samples and stops (:class:`SamplingParams`), and choosing the next
token from the last position's logits, in numpy.

Greedy is ``argmax``. Sampling applies temperature, then top-k, then min-p, then
top-p (nucleus) to the softmax in float64, and draws with a ``numpy.random.Generator``
seeded by the caller, so a seed reproduces the same ids. Before either, a request's
:class:`Penalties` (repetition, presence, frequency) change its own row of logits
(greedy rows too), and a constrained row's grammar mask removes the tokens it forbids
(:mod:`mobius_runtime.constrained`).

Every accepted setting is numerically safe. The logits are shifted by their maximum
*before* the temperature divides them, so every scaled value is <= 0 and the best token
is exactly 0: a subnormal temperature (``1e-310``) sends the others to ``-inf``
(probability 0: greedy, as the limit is) instead of overflowing to ``inf - inf = NaN``;
a huge one flattens them towards uniform. The best token always survives top-k and
top-p and min-p (its scaled logit is 0 >= log(min_p)), so the kept mass is >= 1 before
it is normalised and never 0. ``top_k`` larger than the vocabulary keeps everything;
``top_p`` at its smallest keeps the best token. Penalties only move finite logits by
finite amounts (a ``-inf`` stays ``-inf``, the result is clipped to float64's range).
Logits whose maximum is NaN or infinite are refused (the engine and ``generate`` check
them first and end only that request).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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
    min_p: float = 0.0,
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
    if min_p > 0:  # probability >= min_p * the best one's: the best (scaled 0) always stays
        scaled = np.where(scaled >= math.log(min_p), scaled, -np.inf)
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
    :class:`~mobius_runtime.chat_session.ChatSession`, ``mobius run`` / ``chat`` and ``mobius serve``.

    ``temperature == 0`` is greedy (then ``top_k``, ``top_p`` and ``seed`` do nothing);
    ``top_k`` 0 and ``min_p`` 0 are off. Generation ends at one of ``stop_ids`` (None:
    the family's stop ids), when the text holds one of the ``stop`` strings (the text is
    cut where the earliest begins), after ``max_tokens`` tokens, or at the model's context
    length. Checked when built, by the rules of
    :func:`~mobius_runtime.requests.check_sampling` and :func:`check_penalties`.

    Penalties (greedy rows too): ``repetition_penalty`` (HF's: > 1 divides a positive
    logit of every token already in the prompt or the reply, multiplies a negative one;
    1 is off), ``presence_penalty`` and ``frequency_penalty`` (OpenAI's, in [-2, 2]:
    subtract ``presence + frequency * count`` from the logit of each token the reply
    holds ``count`` times). ``logprobs``: None is off; ``k`` >= 0 records each chosen
    token's log-probability under the model (the log-softmax of its raw logits) and the
    ``k`` most likely tokens'. ``constraint``: the output must match a grammar
    (:class:`~mobius_runtime.constrained.Constraint`, e.g. a JSON schema).
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    constraint: Any = None  # a mobius_runtime.constrained.Constraint

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
        check_penalties(self)
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
        **more: Any,
    ) -> SamplingParams:
        """The params of HF-style keyword arguments (``do_sample=False`` is greedy whatever
        the temperature; every setting is still checked). ``more``: the other fields
        (``min_p``, penalties, ``logprobs``, ``constraint``) by name."""
        check_sampling(do_sample, temperature, top_k, top_p, seed)
        return cls(
            max_tokens=max_tokens,
            temperature=temperature if do_sample else 0.0,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop=stop if isinstance(stop, str) else tuple(stop),  # a str is refused
            stop_ids=None if stop_ids is None else tuple(stop_ids),
            **more,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """True when a penalty changes the logits."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


MAX_LOGPROBS = 20  # OpenAI's limit on top_logprobs


def check_penalties(params: SamplingParams) -> None:
    """``min_p``, the penalties and ``logprobs`` of ``params``: every problem in one error."""
    problems: list[str] = []

    def number(name: str, low: float, high: float, low_open: bool = False) -> None:
        value = getattr(params, name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (low < value if low_open else low <= value)
        if not (ok and value <= high):
            left = "(" if low_open else "["
            problems.append(f"{name} must be a number in {left}{low:g}, {high:g}], got {value!r}")

    number("min_p", 0.0, 1.0)
    number("repetition_penalty", 0.0, 1e6, low_open=True)
    number("presence_penalty", -2.0, 2.0)
    number("frequency_penalty", -2.0, 2.0)
    k = params.logprobs
    if k is not None and (
        isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOGPROBS
    ):
        problems.append(f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {k!r}")
    if problems:
        raise RequestError(
            "; ".join(problems),
            where="sampling options",
            fix="e.g. min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5, logprobs=5",
        )


class Penalties:
    """The repetition / presence / frequency penalties of one request, on its own row.

    Keeps how often each token occurred (prompt and reply for the repetition penalty,
    the reply for presence / frequency); :meth:`apply` touches only those tokens, so its
    work grows with the distinct tokens seen, not with the vocabulary.
    """

    def __init__(self, params: SamplingParams, prompt: Iterable[int] = ()) -> None:
        self.params = params
        self.seen: set[int] = (
            set(int(i) for i in prompt) if params.repetition_penalty != 1 else set()
        )
        self.counts: dict[int, int] = {}

    def push(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1
        if self.params.repetition_penalty != 1:
            self.seen.add(token)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A float64 copy of ``logits`` with the penalties applied (finite stays finite)."""
        p = self.params
        out = np.asarray(logits, dtype=np.float64).reshape(-1).copy()
        size = out.size
        if self.seen:
            ids = np.fromiter((i for i in self.seen if 0 <= i < size), dtype=np.int64)
            values = out[ids]
            with np.errstate(over="ignore"):
                out[ids] = np.where(
                    values > 0, values / p.repetition_penalty, values * p.repetition_penalty
                )
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            items = [(i, c) for i, c in self.counts.items() if 0 <= i < size]
            ids = np.fromiter((i for i, _ in items), dtype=np.int64, count=len(items))
            counts = np.fromiter((c for _, c in items), dtype=np.float64, count=len(items))
            out[ids] -= p.presence_penalty + p.frequency_penalty * counts
        # a huge factor may overflow a finite logit: keep it finite (-inf stays -inf)
        finite = np.isfinite(logits.reshape(-1))
        out = np.where(finite, np.clip(out, -1e300, 1e300), out)
        return out


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
            min_p=p.min_p,
        )
