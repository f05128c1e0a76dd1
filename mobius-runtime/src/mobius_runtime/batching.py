"""Decoding many requests in one batched step: KV layouts, joins and leaves.

A *cohort* is a set of requests whose KV state lives in one batched tensor per state
port (``[B, kvh, L, hd]``, BNSH like every cache the runtime feeds, see
:mod:`mobius_runtime.kvshare`): one decode step of the cohort runs every component once
for all its rows. A prompt is prefilled alone (batch 1, in one step or chunk by chunk:
:meth:`Batcher.start` / :meth:`Batcher.advance`), or with other waiting text prompts in
one padded step (:meth:`Batcher.prefill_many`, padded as the decode layout pads rows, so
the result is a cohort), and then *merged* into the running cohort between steps;
finished or cancelled rows are *dropped* between steps.
Rows have different past lengths, so each row's valid cache positions are padded, and
the runtime feeds per-row ``attention_mask`` / ``position_ids`` (1 = real token, 0 =
padding; positions = the row's own past length) instead of the single-request ones.

Where the padding goes is decided from the graph, per stateful component, by which op
reads each past state port:

- ``com.microsoft.GroupQueryAttention`` (past slots 3/4): **right** padding. GQA takes
  each row's length from ``seqlens_k = sum(attention_mask) - 1`` (what the graph
  derives, see ``mobius.components.gqa_lengths``) and writes that row's new K/V at
  that offset, in the shared capacity-long buffer or in the concatenated present;
  row ``b``'s cache is positions ``[0, P_b)``.
- ONNX ``Attention`` (past slots 4/5): **left** padding. The op appends the new K/V
  at the end of the buffer for every row, and the in-graph masks place the query at
  the last position (``mobius.components.masks``), so a row's cache must end there:
  row ``b`` holds positions ``[L - P_b, L)`` of a length-``L`` buffer, the mask is 0
  before them. Distances (causality, sliding windows) are then the row's own.
- anything else (a state read by another op, a graph mixing both kinds, a state edge
  across components, rank-1 ``position_ids``): no shared layout exists; every request
  stays its own cohort of one and the engine runs one step per cohort (correct, not
  batched), logged once at load.

Masked positions get exactly zero attention weight, so a row's tokens do not depend
on the other rows; ``tests/test_batching.py`` checks that every request's batched ids
equal its ``Pipeline.generate`` ids on both layouts, and that chunked and batched
prefills give the one-step prefill's logits and ids. The layout (share plan, padding
side) is read from each graph once (:func:`mobius_runtime.kvshare.kv_layout`, kept by
``Pipeline.kv_layout``), for the executor and the batcher alike. Merges and drops copy the caches
through host memory (once per join or leave, never per step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mobius_runtime.feeds import last_position, to_numpy, to_ortvalue
from mobius_runtime.kvshare import LEFT, RIGHT, SEQ_AXIS
from mobius_runtime.prefix_cache import Hit


@dataclass(eq=False)
class Prefill:
    """A prompt being prefilled alone, chunk by chunk (:meth:`Batcher.advance`): its ids
    ``[1, S]``, media inputs (fed with the first chunk), capacity, and the KV state of its
    first ``past`` ids."""

    ids: np.ndarray
    media: dict[str, Any]
    capacity: int
    state: dict[str, Any] | None
    past: int

    @property
    def left(self) -> int:
        """Prompt ids not prefilled yet."""
        return int(self.ids.shape[1]) - self.past


@dataclass
class Cohort:
    """Requests decoded together: state OrtValues (batch = rows) and each row's past length.

    ``needs`` are the positions each row may ever hold (prompt + its token limit); shared
    (GQA in-place) buffers are as long as the largest, :attr:`capacity`.
    """

    values: dict[str, Any]
    pasts: list[int]
    needs: list[int]
    shared: bool = False
    # the cohort's IO bindings, kept from step to step (executor.Steps), and a one-row
    # cohort's [1, 1] ids array they read in place; a merged or trimmed cohort starts
    # fresh ones
    steps: Any = field(default=None, repr=False, compare=False)
    step_ids: Any = field(default=None, repr=False, compare=False)
    # the ``values`` dict a one-row step made: its concat buffers hold exactly the past
    # (Batcher._unpadded need not read their shapes again while it is still the values)
    exact: Any = field(default=None, repr=False, compare=False)
    # (the logits OrtValue of the last one-row step, the numpy view of its last position):
    # a recycled logits value (Batcher.recycle) is the same OrtValue at every step
    logits: Any = field(default=None, repr=False, compare=False)

    @property
    def size(self) -> int:
        return len(self.pasts)

    @property
    def capacity(self) -> int | None:
        """The length of the shared buffers (None: every state is on the concat path)."""
        return max(self.needs) if self.shared else None


class Batcher:
    """Prefill, batched decode, merge and drop for the cohorts of one :class:`Pipeline`."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.executor = pipeline.executor
        self.plan = pipeline.plan
        self.side, self.reason = self._layout()
        self._shared = {
            key for key in self.plan.states if pipeline.kv_sharing.get(key.split(".", 1)[0])
        }
        shape = None
        if self.plan.logits is not None:
            comp, port = self.plan.logits.split(".", 1)
            outputs = self.executor.session_of(comp).get_outputs()
            shape = next((o.shape for o in outputs if o.name == port), None)
        self._last_only = bool(shape) and len(shape) > 1 and shape[1] == 1
        """The graph gives the last position's logits only (``mobius build --logits last``)."""
        self.recycle = self._recyclable(shape)
        """The output keys a cohort's steps write into the last step's OrtValue
        (:class:`~mobius_runtime.executor.Steps` ``recycle``): the logits, when the graph
        says their shape follows from the step's batch and sequence length alone. What
        :meth:`decode` returns is then overwritten by the cohort's next step."""

    def _recyclable(self, shape: Sequence[Any] | None) -> frozenset[str]:
        """{the logits key} when its graph shape is [batch, 1 or the ids' sequence, ints...],
        on the CPU (the only device this was measured on: elsewhere the run allocates)."""
        if self.executor.device != "cpu":
            return frozenset()
        if not shape or len(shape) < 2 or not all(isinstance(d, int) for d in shape[2:]):
            return frozenset()
        if shape[1] != 1:  # every position's logits: their length must be the ids' own
            comp = self.plan.logits.split(".", 1)[0]
            inputs, _ = self.executor.io(comp)
            ids = next((dims for name, _, dims in inputs if name == "input_ids"), None)
            if ids is None or len(ids) != 2 or ids[1] != shape[1] or isinstance(shape[1], int):
                return frozenset()
        return frozenset({self.plan.logits})

    def steps(self, capacity: int | None) -> Any:
        """A cohort's :class:`~mobius_runtime.executor.Steps` (its logits recycled)."""
        return self.executor.steps(capacity, self.recycle)

    @property
    def shares(self) -> bool:
        """True when the KV state (some of it) lives in shared, capacity-long buffers."""
        return bool(self._shared)

    @property
    def batches(self) -> bool:
        """True when requests of different lengths can share one decode step."""
        return self.side is not None

    def _layout(self) -> tuple[str | None, str]:
        sides, why = set(), []
        generated = {s.ref for s in self.plan.sources.values() if s.kind == "generated"}
        if "attention_mask" not in generated:
            return None, "no input takes the runtime's attention_mask, so padding cannot be masked"
        for key, source in self.plan.sources.items():
            if source.kind == "generated" and source.ref == "position_ids":
                inputs, _ = self.executor.io(key.split(".", 1)[0])
                rank = next(len(s) for n, _, s in inputs if n == key.split(".", 1)[1])
                if rank != 2:
                    return None, f"{key} has rank {rank} (one position row for the whole batch)"
        for comp in sorted({key.split(".", 1)[0] for key in self.plan.states}):
            layout = self.pipeline.kv_layout(comp)
            side, reason = layout.side, layout.side_reason
            if side is None:
                return None, f"{comp}: {reason}"
            sides.add(side)
            why.append(f"{comp}: {reason}")
        if len(sides) > 1:
            return None, "stateful components need different padding: " + "; ".join(why)
        if not sides:
            return None, "the package has no KV state"
        return sides.pop(), "; ".join(why)

    # ------------------------------------------------------------------ steps

    def start(self, caller: Mapping[str, Any], capacity: int, hit: Hit | None = None) -> Prefill:
        """A request's prompt, ready to be prefilled alone by :meth:`advance`.

        ``hit``: kept KV rows of the prompt's first ``hit.length`` ids
        (:mod:`mobius_runtime.prefix_cache`); only the rest of the prompt is prefilled.
        """
        ids = np.asarray(caller["input_ids"])
        state, past = None, 0
        if hit is not None:
            state, past = {}, hit.length
            for key, (array, kind) in hit.values.items():
                if key in self._shared:  # in-place buffers are capacity long
                    array = _pad(array, capacity, RIGHT)
                state[key] = to_ortvalue(np.ascontiguousarray(array), kind, self.executor.device)
        media = {k: v for k, v in caller.items() if k != "input_ids"}
        return Prefill(ids, media, capacity, state, past)

    def advance(self, job: Prefill, chunk: int | None = None) -> tuple[np.ndarray, Cohort] | None:
        """Prefill the next ``chunk`` ids of ``job`` (None: all the rest); once its whole
        prompt is in, its last logits row and its cohort of one (else None).

        A prompt with media is prefilled in one step whatever ``chunk`` (its encoders'
        features fill every placeholder of the prompt at once). Chunks give the logits a
        one-step prefill gives: each chunk's queries attend the cached positions and their
        own, which is what the causal mask lets the one step's queries attend.
        """
        prompt = job.ids.shape[1]
        end = prompt if chunk is None or job.media else min(prompt, job.past + chunk)
        caller = {**job.media, "input_ids": job.ids[:, job.past : end]}
        values = self.executor.step(caller, job.state, job.past, job.capacity)
        job.media, job.state, job.past = {}, self.executor.next_state(values), end
        if end < prompt:
            return None
        logits = last_position(values[self.plan.logits])[0]
        return logits, Cohort(job.state, [prompt], [job.capacity], self.shares)

    def prefill(
        self, caller: Mapping[str, Any], capacity: int, hit: Hit | None = None
    ) -> tuple[np.ndarray, Cohort]:
        """Run a request's prompt alone in one step; its last logits row and cohort of one."""
        done = self.advance(self.start(caller, capacity, hit))
        assert done is not None  # a whole prompt was fed
        return done

    def prefill_many(
        self, prompts: Sequence[Sequence[int]], capacities: Sequence[int]
    ) -> tuple[np.ndarray, Cohort]:
        """Several text prompts in one step, padded as the layout pads a cohort; returns
        each prompt's last logits row ``[B, V]`` and their cohort (only when :attr:`batches`).

        Left padding (ONNX Attention) ends every prompt at the last column; right padding
        (GroupQueryAttention, which takes each row's length from the mask) starts them at
        the first, so rows of different lengths need every position's logits (a
        ``--logits last`` build batches prompts of one length only: :meth:`can_batch`).
        """
        if self.side is None:
            raise ValueError("this package's requests cannot be batched (see the load log)")
        lengths = [len(p) for p in prompts]
        rows, longest = len(prompts), max(lengths)
        ids = np.zeros((rows, longest), dtype=np.int64)
        mask = np.zeros((rows, longest), dtype=np.int64)
        positions = np.zeros((rows, longest), dtype=np.int64)
        for b, prompt in enumerate(prompts):
            start = longest - lengths[b] if self.side == LEFT else 0
            ids[b, start : start + lengths[b]] = prompt
            mask[b, start : start + lengths[b]] = 1
            positions[b, start : start + lengths[b]] = np.arange(lengths[b])
        generated = {"attention_mask": mask, "position_ids": positions}
        values = self.executor.step({"input_ids": ids}, None, 0, max(capacities), generated)
        logits = to_numpy(values[self.plan.logits])
        if self.side == LEFT or logits.shape[1] == 1:
            last = logits[:, -1]
        else:
            last = logits[np.arange(rows), np.asarray(lengths) - 1]
        state = self.executor.next_state(values)
        return last, Cohort(state, lengths, list(capacities), self.shares)

    def prefill_hits(
        self, prompts: Sequence[Sequence[int]], hits: Sequence[Hit], capacities: Sequence[int]
    ) -> tuple[np.ndarray, Cohort]:
        """Several text prompts of one length whose first ids' KV rows the prefix cache
        holds, each for the same number of ids, in one step: the kept rows stacked into one
        state, the rest of each prompt fed after them. Returns each prompt's last logits
        row ``[B, V]`` and their cohort (only when :attr:`batches`).

        Only where :attr:`batches_hits`: onnxruntime's GroupQueryAttention refuses a
        batch above 1 when more than one new id follows a past ("batch_size must be 1
        when sequence_length > 1 and past context is given"), so a GQA package prefills
        each hit alone. And only hits of one length with prompts of one length (no row
        is padded): ONNX Attention's left layout keeps a row's positions contiguous up
        to the last column, so padding between a cached prefix and the new ids would
        leave a hole that later steps read as the row's past.
        """
        if not self.batches_hits:
            raise ValueError("this package's cache hits cannot be prefilled together")
        cached, total = hits[0].length, len(prompts[0])
        if any(h.length != cached for h in hits) or any(len(p) != total for p in prompts):
            raise ValueError("prefill_hits needs prompts of one length with hits of one length")
        rows, capacity = len(prompts), max(capacities)
        ids = np.asarray([list(p[cached:]) for p in prompts], dtype=np.int64)
        state = {}
        for key, (_, kind) in hits[0].values.items():
            arrays = [h.values[key][0] for h in hits]
            if key in self._shared:  # in-place buffers are capacity long
                arrays = [_pad(a, capacity, RIGHT) for a in arrays]
            joined = np.ascontiguousarray(np.concatenate(arrays, axis=0))
            state[key] = to_ortvalue(joined, kind, self.executor.device)
        mask = np.ones((rows, total), dtype=np.int64)
        positions = np.repeat(np.arange(cached, total, dtype=np.int64)[None, :], rows, axis=0)
        generated = {"attention_mask": mask, "position_ids": positions}
        values = self.executor.step({"input_ids": ids}, state, cached, capacity, generated)
        last = to_numpy(values[self.plan.logits])[:, -1]
        cohort = Cohort(self.executor.next_state(values), [total] * rows, list(capacities))
        cohort.shared = self.shares
        return last, cohort

    @property
    def batches_hits(self) -> bool:
        """True when prompts with cache hits of one length can be prefilled together
        (:meth:`prefill_hits`): the left (ONNX Attention) layout only."""
        return self.side == LEFT

    def can_batch(self, lengths: Sequence[int]) -> bool:
        """True when prompts of these lengths can be prefilled together (:meth:`prefill_many`)."""
        if self.side is None:
            return False
        return self.side == LEFT or not self._last_only or len(set(lengths)) == 1

    def rows(self, cohort: Cohort, length: int, row: int = 0) -> dict[str, tuple[np.ndarray, str]]:
        """A copy of cohort ``row``'s first ``length`` positions, as a prefix cache keeps them."""
        out = {}
        for key, value in cohort.values.items():
            array = to_numpy(value)[row : row + 1]
            start = 0
            if self.side == LEFT and key not in self._shared:  # the row ends at the last column
                start = array.shape[SEQ_AXIS] - cohort.pasts[row]
            array = np.take(array, np.arange(start, start + length), axis=SEQ_AXIS)
            out[key] = (array, value.data_type())
        return out

    def decode(self, cohort: Cohort, tokens: Sequence[int]) -> np.ndarray:
        """One step of every row (``tokens[b]`` is row b's new id); returns logits [B, V].

        The array may be a view of a buffer the cohort's next step writes again
        (:attr:`recycle`): pick from it (or copy it) before stepping the cohort again.
        """
        rows = cohort.size
        if rows == 1 and self._unpadded(cohort):  # the runtime's own mask and positions
            if cohort.steps is None or cohort.steps.capacity != cohort.capacity:
                cohort.steps = self.steps(cohort.capacity)
                cohort.step_ids = np.zeros((1, 1), dtype=np.int64)
            cohort.step_ids[0, 0] = tokens[0]
            values = cohort.steps.step(
                {"input_ids": cohort.step_ids}, cohort.values, cohort.pasts[0]
            )
            if not cohort.steps.state_kept:  # else the same buffers: keep the same mapping
                cohort.values = cohort.exact = self.executor.next_state(values)
            cohort.pasts = [cohort.pasts[0] + 1]
            logits = values[self.plan.logits]
            known = cohort.logits
            if known is not None and known[0] is logits:  # recycled: the same buffer
                return known[1]
            view = last_position(logits)
            if logits.data_type() != "tensor(bfloat16)" and logits.device_name().lower() == "cpu":
                cohort.logits = (logits, view)  # a view of the buffer (last_position)
            return view
        ids = np.asarray(tokens, dtype=np.int64).reshape(rows, 1)
        pasts = np.asarray(cohort.pasts, dtype=np.int64)
        if self.side == LEFT:
            length = self._concat_length(cohort)
            total = length + 1
            starts = total - (pasts + 1)
        else:
            length = int(pasts.max())
            total = length + 1
            starts = np.zeros(rows, dtype=np.int64)
        col = np.arange(total, dtype=np.int64)[None, :]
        ends = starts + pasts + 1
        mask = ((col >= starts[:, None]) & (col < ends[:, None])).astype(np.int64)
        generated = {"attention_mask": mask, "position_ids": pasts.reshape(rows, 1)}
        if cohort.steps is None or cohort.steps.capacity != cohort.capacity:
            cohort.steps = self.steps(cohort.capacity)
        # the cohort's own bindings: its shared KV buffers stay bound from step to step
        values = cohort.steps.step({"input_ids": ids}, cohort.values, length, generated)
        logits = last_position(values[self.plan.logits])
        cohort.values = self.executor.next_state(values)
        cohort.pasts = [p + 1 for p in cohort.pasts]
        return logits

    # ------------------------------------------------------------------ joins and leaves

    def merge(self, a: Cohort, b: Cohort) -> Cohort:
        """One cohort of ``a``'s rows then ``b``'s (only when :attr:`batches`)."""
        if self.side is None:
            raise ValueError("this package's requests cannot be batched (see the load log)")
        joined_rows = Cohort({}, a.pasts + b.pasts, a.needs + b.needs, a.shared or b.shared)
        capacity = joined_rows.capacity
        values = {}
        for key, va in a.values.items():
            vb = b.values[key]
            xa, xb = to_numpy(va), to_numpy(vb)
            if key in self._shared:
                length = int(capacity)  # type: ignore[arg-type]
            else:
                length = max(xa.shape[SEQ_AXIS], xb.shape[SEQ_AXIS])
            side = RIGHT if key in self._shared else self.side
            joined = np.concatenate([_pad(xa, length, side), _pad(xb, length, side)], axis=0)
            values[key] = to_ortvalue(joined, va.data_type(), self.executor.device)
        joined_rows.values = values
        return self._trim(joined_rows)

    def keep(self, cohort: Cohort, rows: Sequence[int]) -> Cohort | None:
        """The cohort of ``rows`` only (in that order); None when no row is left."""
        rows = list(rows)
        if not rows:
            return None
        if rows == list(range(cohort.size)):
            return cohort
        kept = Cohort(
            {}, [cohort.pasts[r] for r in rows], [cohort.needs[r] for r in rows], cohort.shared
        )
        capacity = kept.capacity  # shared buffers shrink to the largest remaining need
        for key, value in cohort.values.items():
            array = to_numpy(value)[rows]
            if key in self._shared:
                array = array[:, :, :capacity]
            kept.values[key] = to_ortvalue(
                np.ascontiguousarray(array), value.data_type(), self.executor.device
            )
        return self._trim(kept)

    def _unpadded(self, cohort: Cohort) -> bool:
        """True when a one-row cohort's concat buffers hold exactly its past (no padding):
        then its step takes the runtime's own mask and positions, as a request alone."""
        if cohort.exact is not None and cohort.exact is cohort.values:
            return True
        return all(
            int(v.shape()[SEQ_AXIS]) == cohort.pasts[0]
            for k, v in cohort.values.items()
            if k not in self._shared
        )

    def _concat_length(self, cohort: Cohort) -> int:
        lengths = {
            int(v.shape()[SEQ_AXIS]) for k, v in cohort.values.items() if k not in self._shared
        }
        if len(lengths) != 1:
            raise RuntimeError(f"concat KV buffers of one cohort differ in length: {lengths}")
        return lengths.pop()

    def _trim(self, cohort: Cohort) -> Cohort:
        """Cut concat buffers to the positions some row still uses (shared ones keep capacity)."""
        if all(k in self._shared for k in cohort.values):
            return cohort
        length = self._concat_length(cohort)
        needed = max(cohort.pasts)
        if needed >= length:
            return cohort
        cut = slice(length - needed, length) if self.side == LEFT else slice(0, needed)
        cohort.exact = None  # its values change in place: _unpadded reads them again
        for key, value in list(cohort.values.items()):
            if key in self._shared:
                continue
            part = np.ascontiguousarray(to_numpy(value)[:, :, cut])
            cohort.values[key] = to_ortvalue(part, value.data_type(), self.executor.device)
        return cohort


def _pad(array: np.ndarray, length: int, side: str) -> np.ndarray:
    """``array`` zero-padded along the sequence axis to ``length`` on ``side``."""
    missing = length - array.shape[SEQ_AXIS]
    if missing <= 0:
        return array
    widths = [(0, 0)] * array.ndim
    widths[SEQ_AXIS] = (missing, 0) if side == LEFT else (0, missing)
    return np.pad(array, widths)
