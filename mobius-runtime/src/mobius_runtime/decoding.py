"""One request's token loop, written once: pick the next token, stream its text, say when
it ends.

:func:`mobius_runtime.generation.run` (``Pipeline.generate``, ``ChatSession``) runs one
:class:`Decoding` (a cohort of one); the serving :class:`~mobius_runtime.engine.Engine`
runs one per row of its batched step. Both therefore pick with the same
:class:`~mobius_runtime.sampling.Sampler`, stop on the same ids, strings and lengths,
and give the same text for the same ids (:class:`~mobius_runtime.text.TextStream`).

The loop around them is here too: :func:`step_rows` decodes one step of a cohort of
1..N rows and has each row take its token (:func:`take_rows`); ``generation.run`` and
``Engine`` call it, and nothing else steps a cohort.

A row's own logits processing happens here too, so it costs that row alone inside a
batched step: its penalties (:class:`~mobius_runtime.sampling.Penalties`), its grammar
mask (:mod:`mobius_runtime.constrained`) and its log-probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from mobius_runtime.requests import check_logits
from mobius_runtime.sampling import Penalties, Sampler, SamplingParams
from mobius_runtime.text import TextStream


class FinishReason(StrEnum):
    """Why a request ended: the one vocabulary of ``generate`` and ``mobius serve``.

    ``GenerationResult.stop_reason`` and ``mobius run --json`` report these values;
    the server maps them to OpenAI's ``finish_reason`` (``stop`` / ``length``) in one
    place (``serve.app.finish_reason``).
    """

    STOP_ID = "stop_id"  # a stop id was chosen
    STOP_STRING = "stop_string"  # the text holds a stop string (cut where it begins)
    MAX_TOKENS = "max_new_tokens"  # max_tokens tokens were generated
    CONTEXT = "context_length"  # the model's positions are full
    CANCELLED = "cancelled"  # the caller (or the server's shutdown) ended it
    GRAMMAR = "grammar"  # the constrained output is complete (its grammar allows no more)


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log-probability under the model, and the ``k`` likeliest tokens'."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: np.ndarray, token: int, k: int) -> TokenLogprob:
    """The log-softmax of the raw ``logits`` (float64) at ``token``, and its top ``k``."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    top = float(np.max(row))
    with np.errstate(under="ignore"):
        norm = top + float(np.log(np.sum(np.exp(row - top))))
    best: tuple[tuple[int, float], ...] = ()
    if k:
        ids = np.argpartition(-row, min(k, row.size) - 1)[:k]
        ids = ids[np.argsort(-row[ids], kind="stable")]
        best = tuple((int(i), float(row[i] - norm)) for i in ids)
    return TokenLogprob(int(token), float(row[token] - norm), best)


class Decoding:
    """The generation state of one request: its sampler, stops, ids and text stream.

    ``stop_ids``: the family's stop ids, used when ``params.stop_ids`` is None.
    ``context``: the model's positions (None: no cap). ``sampler``: one to continue
    (a conversation keeps its random state across turns); default a fresh one.
    ``live``: pieces are read as they come (else only the final text is decoded).
    ``prompt``: the prompt's ids (the repetition penalty counts them).
    """

    def __init__(
        self,
        params: SamplingParams,
        text: Any,
        stop_ids: Iterable[int],
        context: int | None,
        sampler: Sampler | None = None,
        live: bool = True,
        prompt: Sequence[int] = (),
    ) -> None:
        self.params = params
        self.sampler = sampler or Sampler(params)
        self.stop_ids = set(stop_ids if params.stop_ids is None else params.stop_ids)
        self.context = context
        self.stream = TextStream(text, params.stop, live)
        self.ids = self.stream.ids
        self.reason: FinishReason | None = None
        self.text = ""  # the final text, once the request has ended
        self.penalties = Penalties(params, prompt) if params.penalized else None
        self.matcher = None if params.constraint is None else params.constraint.matcher()
        self.logprobs: list[TokenLogprob] = []  # one per id, when params.logprobs is set
        # the argmax of the raw logits is the pick (no penalty or grammar changes them)
        self._plain = params.greedy and self.penalties is None and self.matcher is None

    def take(
        self, logits: np.ndarray, past: int, finite: bool = False, greedy: int | None = None
    ) -> tuple[int, str]:
        """Pick the token after ``past`` fed positions from the row's ``logits``.

        Returns (the token, the text it releases); sets :attr:`reason` when the request
        ends with it (the text then holds everything up to the final text's end).
        ``finite``: the caller has checked the row's largest logit is finite;
        ``greedy``: the row's argmax, already taken (used only when greedy). NaN or
        infinite logits raise :class:`~mobius_runtime.errors.RequestError`.
        """
        if self._plain:
            token = int(logits.argmax()) if greedy is None else greedy
            if not finite and not math.isfinite(logits[token]):  # argmax lands on NaN / +inf
                check_logits(logits, len(self.ids))
        else:
            if not finite:
                check_logits(logits, len(self.ids))
            row = logits
            if self.penalties is not None:
                row = self.penalties.apply(row)
            if self.matcher is not None:
                row = self.matcher.mask(row, self.stop_ids)
            token = int(np.argmax(row)) if self.params.greedy else self.sampler.pick(row)
        if self.params.logprobs is not None:
            self.logprobs.append(token_logprob(logits, token, self.params.logprobs))
        if self.penalties is not None:
            self.penalties.push(token)
        done = self.matcher is not None and self.matcher.accept(token, self.stop_ids)
        piece = self.stream.push(token)
        if token in self.stop_ids:
            self.reason = FinishReason.STOP_ID
        elif done:
            self.reason = FinishReason.GRAMMAR
        elif self.stream.stopped:
            self.reason = FinishReason.STOP_STRING
        elif len(self.ids) >= self.params.max_tokens:
            self.reason = FinishReason.MAX_TOKENS
        elif self.context is not None and past + 1 > self.context:
            self.reason = FinishReason.CONTEXT
        if self.reason is not None:
            piece += self.finish()
        return token, piece

    def finish(self) -> str:
        """Decode the final text (once); returns the part of it not released yet."""
        self.text, rest = self.stream.finish()
        return rest


# ---------------------------------------------------------------- the loop of a cohort

Taken = Callable[[int, int, str], None]  # (row index, its token, the text it released)
Failed = Callable[[int, Exception], None]  # (row index, what its own step raised)


def take_rows(
    rows: Sequence[Decoding],
    logits: np.ndarray,
    pasts: Sequence[int],
    taken: Taken | None = None,
    failed: Failed | None = None,
    where: Sequence[int] | None = None,
) -> None:
    """Each of ``rows`` picks its next token (:meth:`Decoding.take`) from its row of
    ``logits`` [B, V] (row ``where[i]``, default ``i``) after ``pasts`` of that row fed
    positions; ``taken(i, token, piece)`` follows each pick.

    ``failed(i, exc)``: a row whose own pick (or ``taken``) raises ends alone, the
    others go on (None: the exception propagates). With several rows, one reduction
    over the step gives every row's finiteness check and greedy argmax; a single row
    makes its own, the same values.
    """
    if len(rows) == 1:  # a request alone: its row checks itself (no step-wide pass)
        b = 0 if where is None else where[0]
        try:
            token, piece = rows[0].take(logits[b], pasts[b])
            if taken is not None:
                taken(0, token, piece)
        except Exception as exc:
            if failed is None:
                raise
            failed(0, exc)
        return
    where = range(len(rows)) if where is None else where
    finite = np.isfinite(np.max(logits, axis=-1))
    greedy = np.argmax(logits, axis=-1)
    for i, (row, b) in enumerate(zip(rows, where, strict=True)):
        try:
            best = int(greedy[b]) if row.params.greedy else None
            token, piece = row.take(logits[b], pasts[b], bool(finite[b]), best)
            if taken is not None:
                taken(i, token, piece)
        except Exception as exc:
            if failed is None:
                raise
            failed(i, exc)


def step_rows(
    batcher: Any,
    cohort: Any,
    rows: Sequence[Decoding],
    taken: Taken | None = None,
    failed: Failed | None = None,
) -> None:
    """One decode step of ``cohort`` (a :class:`~mobius_runtime.batching.Cohort` of 1..N
    rows, in ``rows``' order: each feeds its last id), then each row's next token
    (:func:`take_rows`).

    The loop of ``Pipeline.generate`` / ``ChatSession`` (one row) and of the serving
    engine (each cohort's step) is this function, so the same ids give the same tokens
    and text everywhere.
    """
    logits = batcher.decode(cohort, [row.ids[-1] for row in rows])
    take_rows(rows, logits, cohort.pasts, taken, failed)
