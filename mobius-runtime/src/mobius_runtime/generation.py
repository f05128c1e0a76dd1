"""The generation loop of one request: a cohort of one through the batched step.

:func:`run` prefills a prompt (after the positions a kept state holds) and then steps a
:class:`~mobius_runtime.batching.Cohort` of one row with
:func:`~mobius_runtime.decoding.step_rows` (one batched step, then each row's
:meth:`Decoding.take <mobius_runtime.decoding.Decoding.take>`): the one loop the serving
engine runs for each of its cohorts, so ``Pipeline.generate``, ``ChatSession`` and
``mobius serve`` give the same ids and text for the same prompt by construction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mobius_runtime.batching import Cohort
from mobius_runtime.decoding import Decoding, FinishReason, TokenLogprob, step_rows, take_rows
from mobius_runtime.feeds import last_position
from mobius_runtime.sampling import Sampler, SamplingParams


@dataclass
class GenerationResult:
    """What ``generate()`` returns: generated ids (no prompt), text and timings."""

    ids: list[int]
    text: str
    prompt_ids: list[int]
    prefill_ms: float
    decode_ms: float
    stop_reason: FinishReason  # a str: "stop_id", "stop_string", "max_new_tokens", …
    timings: dict[str, float] = field(default_factory=dict)
    logprobs: list[TokenLogprob] | None = None  # one per id, when SamplingParams.logprobs is set

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second over the decode steps (the first token comes from prefill)."""
        steps = len(self.ids) - 1
        return steps / (self.decode_ms / 1000.0) if steps > 0 and self.decode_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ids": list(self.ids),
            "text": self.text,
            "prompt_tokens": len(self.prompt_ids),
            "stop_reason": self.stop_reason,
            "timings": {
                "prefill_ms": round(self.prefill_ms, 3),
                "decode_ms": round(self.decode_ms, 3),
                "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            },
        }


def run(
    pipeline: Any,
    caller: dict[str, Any],
    ids: np.ndarray,
    state: Any,
    past: int,
    capacity: int | None,
    params: SamplingParams,
    on_token: Callable[[int, str], None] | None,
    sampler: Sampler | None = None,
) -> tuple[GenerationResult, tuple[Any, int]]:
    """Prefill ``ids`` [1, S] (after ``past`` cached positions in ``state``), then decode.

    ``capacity`` (prompt + every token to come) selects shared KV buffers where the graph
    allows them (None: the concat path, a conversation's growing state). ``sampler``: one
    whose random state continues (a conversation). ``on_token(id, piece)`` as each token
    is chosen. Returns the result and (state, positions in it): every id fed to the model
    is in that state; the last generated id is not (it was never fed).
    """
    row = Decoding(
        params,
        pipeline.text,
        pipeline.text.processors.stop_token_ids,
        pipeline.context_length,
        sampler,
        live=on_token is not None,
        prompt=ids[0].tolist(),
    )
    executor, batcher = pipeline.executor, pipeline.batcher
    start = time.perf_counter()
    steps = batcher.steps(capacity)  # the request's IO bindings, kept between its steps
    values = steps.step({**caller, "input_ids": ids}, state, past)
    logits = last_position(values[pipeline.plan.logits])[0]
    past += int(ids.shape[1])
    shared = capacity is not None and batcher.shares
    cohort = Cohort(executor.next_state(values), [past], [capacity or past], shared)
    if cohort.capacity == capacity:  # Batcher.decode steps on with the same bindings
        cohort.steps = steps
        cohort.step_ids = np.zeros((1, 1), dtype=np.int64)
    prefill_ms = (time.perf_counter() - start) * 1000.0
    decode_start = time.perf_counter()
    rows = [row]
    taken = None if on_token is None else (lambda _, token, piece: on_token(token, piece))
    take_rows(rows, logits[None, :], cohort.pasts, taken)
    while row.reason is None:
        step_rows(batcher, cohort, rows, taken)
    decode_ms = (time.perf_counter() - decode_start) * 1000.0
    result = GenerationResult(
        ids=list(row.ids),
        text=row.text,
        prompt_ids=[int(i) for i in ids[0]],
        prefill_ms=prefill_ms,
        decode_ms=decode_ms,
        stop_reason=row.reason,
        logprobs=None if params.logprobs is None else row.logprobs,
    )
    return result, (cohort.values, cohort.pasts[0])
