"""One request's token loop, written once: pick the next token, stream its text, say when
it ends.

:meth:`Pipeline.decode <mobius_runtime.pipeline.Pipeline.decode>` runs one
:class:`Decoding` (a cohort of one); the serving :class:`~mobius_runtime.engine.Engine`
runs one per row of its batched step. Both therefore pick with the same
:class:`~mobius_runtime.sampling.Sampler`, stop on the same ids, strings and lengths,
and give the same text for the same ids (:class:`~mobius_runtime.text.TextStream`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

import numpy as np

from mobius_runtime.requests import check_logits
from mobius_runtime.sampling import Sampler, SamplingParams
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


class Decoding:
    """The generation state of one request: its sampler, stops, ids and text stream.

    ``stop_ids``: the family's stop ids, used when ``params.stop_ids`` is None.
    ``context``: the model's positions (None: no cap). ``sampler``: one to continue
    (a conversation keeps its random state across turns); default a fresh one.
    ``live``: pieces are read as they come (else only the final text is decoded).
    """

    def __init__(
        self,
        params: SamplingParams,
        text: Any,
        stop_ids: Iterable[int],
        context: int | None,
        sampler: Sampler | None = None,
        live: bool = True,
    ) -> None:
        self.params = params
        self.sampler = sampler or Sampler(params)
        self.stop_ids = set(stop_ids if params.stop_ids is None else params.stop_ids)
        self.context = context
        self.stream = TextStream(text, params.stop, live)
        self.ids = self.stream.ids
        self.reason: FinishReason | None = None
        self.text = ""  # the final text, once the request has ended

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
        if self.params.greedy:
            token = int(np.argmax(logits)) if greedy is None else greedy
            if not finite and not np.isfinite(logits[token]):  # argmax lands on NaN / +inf
                check_logits(logits, len(self.ids))
        else:
            if not finite:
                check_logits(logits, len(self.ids))
            token = self.sampler.pick(logits)
        piece = self.stream.push(token)
        if token in self.stop_ids:
            self.reason = FinishReason.STOP_ID
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
