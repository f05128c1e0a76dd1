"""Continuous batching: one thread decodes every active request in one batched step.

Requests are queued by :meth:`Engine.submit` (any thread); the engine thread loops:

1. drop the rows of cancelled requests (a client that went away frees its slot here,
   at the next step);
2. admit queued requests while fewer than ``max_batch`` hold a slot (decoding or being
   prefilled);
3. one prefill step of at most ``prefill_chunk`` prompt ids: the next chunk of the
   first admitted prompt (a long prompt takes several turns), or several short waiting
   text prompts together in one padded step; a prompt with media is prefilled whole
   (its encoders run here). A prompt whose prefill is complete picks its first token
   and joins the running cohort (:mod:`mobius_runtime.batching`). New prompts thus
   delay the running rows by one chunk a step, never by whole prompts;
4. one batched decode step for all active rows; each row picks its next token with
   its own sampler and seed, streams its new text, and leaves when it stops (per row:
   :class:`~mobius_runtime.decoding.Decoding`, the logic ``Pipeline.generate`` runs).

A full queue (``max_queue`` waiting beyond the free batch slots: 0 means requests are
taken only while a slot is free) refuses at once (:class:`QueueFull`), never
blocks. Per request, events go to its ``sink`` from the engine thread:
``("delta", text)`` (after each token's ``("logprobs", TokenLogprob)`` when the
request asks for logprobs), then ``("done", Finished)`` or ``("error", exception)``.
Text is streamed as it becomes decodable, decoding only the new ids
(:class:`~mobius_runtime.text.TextStream`); text that might be the start of a ``stop``
string is held back until it is known not to be one, so streamed deltas concatenate to
the final text, which is ``generate()``'s for the same ids. One log line per finished
request: id, prompt and completion tokens, time to first token, decode tokens/s, finish
reason, prompt tokens served by the prefix cache (``prefix_cache_mb`` > 0 keeps the KV
rows of recent text prompts: :mod:`mobius_runtime.prefix_cache`).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mobius_runtime.batching import Batcher, Cohort, Prefill
from mobius_runtime.decoding import (
    Decoding,
    Failed,
    FinishReason,
    Taken,
    TokenLogprob,
    step_rows,
    take_rows,
)
from mobius_runtime.errors import RequestError
from mobius_runtime.kvshare import SEQ_AXIS
from mobius_runtime.limits import PREFILL_CHUNK
from mobius_runtime.prefix_cache import Hit, PrefixCache
from mobius_runtime.sampling import SamplingParams

log = logging.getLogger("mobius_runtime.serve")


class QueueFull(Exception):
    """The engine's queue holds ``max_queue`` requests already."""


class EngineStopped(Exception):
    """The engine is shutting down and takes no more requests."""


@dataclass(frozen=True)
class Finished:
    """What a finished request reports: its text, why it stopped and its token counts."""

    text: str
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float
    tokens_per_s: float
    logprobs: list[TokenLogprob] | None = None  # one per id, when the request asked
    cached_tokens: int = 0  # prompt ids served by the prefix cache


@dataclass(eq=False)
class Request:
    """One request in the engine. ``caller`` are its inputs (ids [1, S], media arrays)."""

    id: str
    caller: dict[str, Any]
    row: Decoding
    sink: Callable[[str, Any], None]
    prompt_tokens: int = 0
    cancelled: bool = False
    submitted: float = 0.0
    first: float | None = None
    group: list[Request] = field(default_factory=list)  # rows sharing this one's prefill
    cached_tokens: int = 0  # prompt ids whose KV rows came from the prefix cache
    hit: Hit | None = None  # the prefix cache's kept rows for its prompt (looked up on admission)
    job: Prefill | None = None  # its prompt, while prefilled chunk by chunk

    @property
    def sampling(self) -> SamplingParams:
        return self.row.params

    @property
    def ids(self) -> list[int]:
        return self.row.ids


class Engine:
    """Runs the requests of one :class:`~mobius_runtime.pipeline.Pipeline` in batched steps."""

    def __init__(
        self,
        pipeline: Any,
        max_batch: int = 8,
        max_queue: int = 64,
        prefix_cache_mb: float = 0.0,
        prefill_chunk: int = PREFILL_CHUNK,
    ) -> None:
        if max_batch < 1 or max_queue < 0 or prefix_cache_mb < 0 or prefill_chunk < 0:
            raise ValueError(
                "max_batch must be >= 1, max_queue, prefix_cache_mb and prefill_chunk >= 0"
            )
        self.pipeline = pipeline
        self.batcher: Batcher = pipeline.batcher
        if self.batcher.side is None:
            log.warning("requests are decoded one by one, not batched: %s", self.batcher.reason)
        else:
            log.info("batched decode with %s padding (%s)", self.batcher.side, self.batcher.reason)
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk  # prompt ids between two decode steps (0: no limit)
        self.stops = set(pipeline.text.processors.stop_token_ids)
        self.context = pipeline.context_length
        self._waiting: collections.deque[Request] = collections.deque()
        self._prefilling: list[Request] = []  # admitted (slots taken), prompts not all in yet
        self._cohorts: list[tuple[Cohort, list[Request]]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self.steps = 0  # decode steps run (all cohorts of one loop count once)
        self.peak_batch = 0  # the most requests one decode step has served
        self.prefills = 0  # prompts prefilled (a group of n choices counts once)
        self.prefill_steps = 0  # prefill steps run (a chunk, or several prompts together)
        # KV rows of recent text prompts (None: off); see mobius_runtime.prefix_cache
        budget = int(prefix_cache_mb * 1024 * 1024)
        self.cache = PrefixCache(budget, SEQ_AXIS) if budget else None
        self.finished: collections.Counter[str] = collections.Counter()  # by finish reason

    # ------------------------------------------------------------------ public

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mobius-engine", daemon=True)
        self._thread.start()

    def submit(
        self,
        caller: dict[str, Any],
        sampling: SamplingParams,
        sink: Callable[[str, Any], None],
        request_id: str | None = None,
    ) -> Request:
        """Queue a request (``caller["input_ids"]`` is [1, S]); raises QueueFull at once.

        A request is taken while fewer than ``max_queue`` plus the free batch slots wait.
        """
        return self.submit_group(caller, [sampling], [sink], request_id)[0]

    def submit_group(
        self,
        caller: dict[str, Any],
        samplings: list[SamplingParams],
        sinks: list[Callable[[str, Any], None]],
        request_id: str | None = None,
    ) -> list[Request]:
        """Queue one request per sampling for the same prompt (OpenAI's ``n``): the prompt
        is prefilled once and its KV rows copied to each (where the graph batches; else
        each is prefilled on its own). Raises QueueFull at once, as :meth:`submit`."""
        prompt = int(np.shape(caller["input_ids"])[1])
        ids = np.asarray(caller["input_ids"])[0].tolist()
        rid = request_id or f"req-{next(self._ids)}"
        now = time.perf_counter()
        requests = [
            Request(
                id=rid if len(samplings) == 1 else f"{rid}/{i}",
                caller=caller,
                row=Decoding(sampling, self.pipeline.text, self.stops, self.context, prompt=ids),
                sink=sink,
                prompt_tokens=prompt,
                submitted=now,
            )
            for i, (sampling, sink) in enumerate(zip(samplings, sinks, strict=True))
        ]
        queued = requests[:1]
        if self.batcher.batches:
            requests[0].group = requests[1:]
        else:
            queued = requests
        with self._cond:
            if self._stopping:
                raise EngineStopped("the server is shutting down")
            # max_queue counts the requests waiting beyond the free batch slots
            free = max(0, self.max_batch - self.active)
            if len(self._waiting) + len(queued) > self.max_queue + free:
                raise QueueFull(f"{len(self._waiting)} requests are queued (--max-queue)")
            self._waiting.extend(queued)
            self._cond.notify()
        return requests

    def cancel(self, request: Request) -> None:
        """Stop ``request``; its slot is freed before the next decode step."""
        with self._cond:
            request.cancelled = True
            self._cond.notify()

    @property
    def active(self) -> int:
        """Requests holding a batch slot: decoding, or admitted and being prefilled."""
        decoding = sum(len(rows) for _, rows in self._cohorts)
        return decoding + sum(1 + len(r.group) for r in self._prefilling)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> bool:
        """The engine thread was started and has not ended (a replica's health check)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Refuse new requests, cancel queued and running ones, join the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        while True:
            with self._cond:
                while (
                    not self._stopping
                    and not self._waiting
                    and not self._prefilling
                    and not self._cohorts
                ):
                    self._cond.wait()
                if self._stopping:
                    break
            try:
                self._iterate()
            except Exception as exc:  # a bug or a device failure: fail every request
                log.exception("engine step failed")
                prefilling = [m for r in self._prefilling for m in (r, *r.group)]
                for request in prefilling + [r for _, rows in self._cohorts for r in rows]:
                    try:
                        request.sink("error", exc)
                    except Exception:  # a sink that fails must not stop the others
                        log.exception("%s: its sink failed", request.id)
                self._cohorts, self._prefilling = [], []
        with self._cond:
            waiting = [m for r in (*self._waiting, *self._prefilling) for m in (r, *r.group)]
            left = waiting + [r for _, rows in self._cohorts for r in rows]
            self._waiting.clear()
        self._cohorts, self._prefilling = [], []
        for request in left:
            self._finish(request, FinishReason.CANCELLED)

    def _iterate(self) -> None:
        """One turn of the loop: leaves, admissions, one prefill step, one decode step.

        At most ``prefill_chunk`` prompt ids are prefilled between two decode steps, so
        a long prompt (or many) delays the running rows by one chunk's time a step, not
        by whole prompts: a prompt longer than that is prefilled a chunk per turn, and
        several short waiting prompts are prefilled together in one batched step.
        """
        self._drop(lambda r: r.cancelled, FinishReason.CANCELLED)
        self._admit()
        self._prefill()
        if not self._cohorts:
            return
        self.peak_batch = max(self.peak_batch, sum(len(rows) for _, rows in self._cohorts))
        for cohort, rows in self._cohorts:  # the loop generate() runs, per cohort
            step_rows(self.batcher, cohort, [r.row for r in rows], *self._callbacks(rows))
        self.steps += 1
        self._drop(lambda r: r.first is None, None)

    def _admit(self) -> None:
        """Take queued requests while batch slots are free (their prefill comes later)."""
        while self.active < self.max_batch:
            with self._cond:
                if not self._waiting:
                    break
                request = self._waiting.popleft()
            if request.cancelled:  # its group was asked for together: it goes together
                for member in (request, *request.group):
                    self._finish(member, FinishReason.CANCELLED)
                continue
            # only text prompts use the cache: media soft tokens carry features ids do not name
            if self.cache is not None and set(request.caller) == {"input_ids"}:
                try:
                    request.hit = self.cache.lookup(self._prompt(request))
                except Exception as exc:
                    self._fail_group(request, exc)
                    continue
            self._prefilling.append(request)

    def _prefill(self) -> None:
        """One prefill step: the next chunk of the first admitted prompt, or several whole
        fresh text prompts together (where the layout batches them)."""
        while self._prefilling and self._prefilling[0].cancelled:
            request = self._prefilling.pop(0)
            for member in (request, *request.group):
                self._finish(member, FinishReason.CANCELLED)
        if not self._prefilling:
            return
        head = self._prefilling[0]
        together = self._together() if head.job is None else [head]
        try:
            if len(together) > 1:
                capacities = [self._capacity(r) for r in together]
                prompts = [self._prompt(r) for r in together]
                if head.hit is not None:  # cache hits of one length, prompts of one length
                    hits = [r.hit for r in together]
                    logits, cohort = self.batcher.prefill_hits(prompts, hits, capacities)  # type: ignore[arg-type]
                else:
                    logits, cohort = self.batcher.prefill_many(prompts, capacities)
            else:
                if head.job is None:
                    head.job = self.batcher.start(head.caller, self._capacity(head), head.hit)
                done = self.batcher.advance(head.job, self.prefill_chunk or None)
                self.prefill_steps += 1
                if done is None:
                    return
                logits, cohort = done[0][None, :], done[1]
        except Exception as exc:
            for request in together:
                self._prefilling.remove(request)
                self._fail_group(request, exc)
            return
        if len(together) > 1:
            self.prefill_steps += 1
        del self._prefilling[: len(together)]
        self.prefills += len(together)
        if self.cache is not None:
            for b, request in enumerate(together):
                if set(request.caller) == {"input_ids"}:
                    ids = self._prompt(request)
                    self.cache.add(ids, self.batcher.rows(cohort, len(ids), b))
        members = []
        for b, request in enumerate(together):
            cached = request.hit.length if request.hit is not None else 0
            request.job = request.hit = None  # their KV rows are in the cohort now
            for member in (request, *request.group):
                member.cached_tokens = cached
                members.append((member, b))
        self._join(cohort, logits, members)

    def _together(self) -> list[Request]:
        """The first admitted prompts that one batched step prefills whole (at least the
        first one): fresh text prompts without ``n`` groups whose padded ids fit
        ``prefill_chunk``, or, after a prompt with a prefix-cache hit, the prompts of its
        length whose hits are as long (their new ids, together, fit ``prefill_chunk``;
        ONNX Attention packages only: :meth:`Batcher.prefill_hits`)."""
        first = self._prefilling[0]
        if not self.prefill_chunk or not self._plain(first, first.hit):
            return [first]
        if first.hit is not None:  # hits batch when nothing needs padding (prefill_hits)
            if not self.batcher.batches_hits:
                return [first]
            picked, fed = [first], first.prompt_tokens - first.hit.length
            for request in self._prefilling[1:]:
                hit = request.hit
                same = hit is not None and hit.length == first.hit.length
                if not (same and request.prompt_tokens == first.prompt_tokens):
                    break
                if not self._plain(request, hit) or (len(picked) + 1) * fed > self.prefill_chunk:
                    break
                picked.append(request)
            return picked
        picked, lengths = [first], [first.prompt_tokens]
        for request in self._prefilling[1:]:
            if not self._plain(request):
                break
            lengths.append(request.prompt_tokens)
            if len(lengths) * max(lengths) > self.prefill_chunk or not self.batcher.can_batch(
                lengths
            ):
                break
            picked.append(request)
        return picked

    def _plain(self, request: Request, hit: Hit | None = None) -> bool:
        """``request`` may be prefilled with others: a text prompt alone (no ``n`` group),
        not started, with no cache hit (or the one given: see :meth:`_together`)."""
        return (
            request.job is None
            and request.hit is hit
            and not request.group
            and not request.cancelled
            and set(request.caller) == {"input_ids"}
            and self.batcher.batches
        )

    def _capacity(self, request: Request) -> int:
        """Positions ``request`` (its whole group) may hold: prompt + the largest max_tokens."""
        members = [request, *request.group]
        capacity = request.prompt_tokens + max(r.sampling.max_tokens for r in members)
        return capacity if self.context is None else min(capacity, self.context)

    @staticmethod
    def _prompt(request: Request) -> list[int]:
        return np.asarray(request.caller["input_ids"])[0].tolist()

    def _fail_group(self, request: Request, exc: Exception) -> None:
        for member in (request, *request.group):
            self._fail(member, exc)

    def _join(self, cohort: Cohort, logits: np.ndarray, members: list[tuple[Request, int]]) -> None:
        """Pick each prefilled member's first token from its row's ``logits`` and join the
        members still running to the decoding cohort (row ``b`` of ``cohort`` is theirs;
        members of one ``n`` group share a row, copied)."""
        first = time.perf_counter()
        for member, _ in members:
            member.caller = {}  # media arrays are no longer needed
            member.first = first
        joining = [m for m, _ in members]
        rows, where = [m.row for m in joining], [b for _, b in members]
        take_rows(rows, logits, cohort.pasts, *self._callbacks(joining), where)
        running = [(m, b) for m, b in members if m.first is not None]  # not finished yet
        if not running:
            return
        kept = self.batcher.keep(cohort, [b for _, b in running])
        rows = [m for m, _ in running]
        if self.batcher.batches and self._cohorts:
            main, joined = self._cohorts[0]
            self._cohorts[0] = (self.batcher.merge(main, kept), [*joined, *rows])
        else:
            self._cohorts.append((kept, rows))

    def _callbacks(self, requests: list[Request]) -> tuple[Taken, Failed]:
        """What the loop calls for row ``i`` of ``requests``: after its token (stream its
        logprobs and text, finish it when it stops), and when its own step fails (it
        alone ends)."""

        def taken(i: int, token: int, piece: str) -> None:
            request = requests[i]
            row = request.row
            if request.sampling.logprobs is not None:  # before the text it may release
                request.sink("logprobs", row.logprobs[-1])
            if piece:
                request.sink("delta", piece)
            if row.reason is not None:
                self._finish(request, row.reason)

        return taken, lambda i, exc: self._fail(requests[i], exc)

    def _fail(self, request: Request, exc: Exception) -> None:
        """End ``request`` alone with ``exc`` (its row leaves the cohort at the step's end).

        A failure of one row (its sampler, its detokenizer, its sink) must not reach the
        other rows of the batched step: they go on as if it had finished.
        """
        request.first = None
        self.finished["error"] += 1
        if isinstance(exc, RequestError):
            log.warning("%s failed: %s", request.id, exc.what)
        else:
            log.error("%s failed", request.id, exc_info=exc)
        try:
            request.sink("error", exc)
        except Exception:  # a sink that fails must not stop the others
            log.exception("%s: its sink failed", request.id)

    def _finish(self, request: Request, reason: FinishReason) -> None:
        """Report ``request`` done (its text: the final one, or what was released when it
        is cancelled) and mark its row to leave the cohort."""
        now = time.perf_counter()
        row = request.row
        text = row.text if row.reason is not None else row.stream.released
        n = len(row.ids)
        ttft = ((request.first or now) - request.submitted) * 1000.0
        rate = (n - 1) / (now - request.first) if request.first and n > 1 else 0.0
        logprobs = None if request.sampling.logprobs is None else row.logprobs
        cached = request.cached_tokens
        finished = Finished(text, reason, request.prompt_tokens, n, ttft, rate, logprobs, cached)
        request.first = None  # marks it done: its row leaves the cohort
        self.finished[reason] += 1
        log.info(
            "%s prompt_tokens=%d completion_tokens=%d ttft_ms=%.1f tokens_per_s=%.1f finish=%s"
            " cached_tokens=%d",
            request.id,
            request.prompt_tokens,
            n,
            ttft,
            rate,
            reason,
            cached,
        )
        request.sink("done", finished)

    def _drop(self, gone: Callable[[Request], bool], reason: FinishReason | None) -> None:
        """Remove the rows of requests for which ``gone`` holds (finishing them as ``reason``)."""
        if not any(gone(r) for _, rows in self._cohorts for r in rows):
            return  # the common step: nobody left, every cohort stays as it is
        cohorts = []
        for cohort, rows in self._cohorts:
            keep = [i for i, r in enumerate(rows) if not gone(r)]
            if reason is not None:
                for r in rows:
                    if gone(r) and r.first is not None:
                        self._finish(r, reason)
            kept = self.batcher.keep(cohort, keep)
            if kept is not None:
                cohorts.append((kept, [rows[i] for i in keep]))
        self._cohorts = cohorts
