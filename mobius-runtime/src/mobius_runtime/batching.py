"""Decoding many requests in one batched step: KV layouts, joins and leaves.

A *cohort* is a set of requests whose KV state lives in one batched tensor per state
port (``[B, kvh, L, hd]``, BNSH like every cache the runtime feeds, see
:mod:`mobius_runtime.kvshare`): one decode step of the cohort runs every component once
for all its rows. Requests are prefilled alone (batch 1) and then *merged* into the
running cohort between steps; finished or cancelled rows are *dropped* between steps.
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
equal its ``Pipeline.generate`` ids on both layouts. Merges and drops copy the caches
through host memory (once per join or leave, never per step).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mobius_runtime.feeds import last_position, to_numpy, to_ortvalue
from mobius_runtime.kvshare import GQA_OP, SEQ_AXIS
from mobius_runtime.prefix_cache import Hit

log = logging.getLogger("mobius_runtime.batching")

LEFT, RIGHT = "left", "right"
_ATTENTION_OP = ("", "Attention")
_PAST_SLOTS = {GQA_OP: ((3, 4), RIGHT), _ATTENTION_OP: ((4, 5), LEFT)}


def padding_side(component: str, path: Path, states: Mapping[str, str]) -> tuple[str | None, str]:
    """(``"left"`` | ``"right"`` | None, why) for the state ports of ``component``."""
    import onnx

    prefix = f"{component}."
    ports = [key[len(prefix) :] for key in states if key.startswith(prefix)]
    if any(not states[prefix + port].startswith(prefix) for port in ports):
        return None, "a state edge crosses components"
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # unreadable graph: the session load reports it properly
        return None, f"cannot read the graph ({exc})"
    inputs = {v.name: v for v in graph.input}
    readers: dict[str, list[tuple[tuple[str, str], int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append(((node.domain, node.op_type), i))
    sides = set()
    for port in ports:
        if port not in inputs or len(inputs[port].type.tensor_type.shape.dim) != 4:
            return None, f"state {port} is not a rank-4 graph input"
        for op, slot in readers.get(port, []):
            slots, side = _PAST_SLOTS.get(op, ((), None))
            if slot not in slots:
                return None, f"state {port} is read by {op[1]} (input {slot})"
            sides.add(side)
    if len(sides) != 1:
        return None, "its states are read by both Attention and GroupQueryAttention"
    side = sides.pop()
    return side, "every past is read by " + (
        "GroupQueryAttention" if side == RIGHT else "Attention"
    )


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
        self.side, reason = self._layout()
        if self.side is None:
            log.warning("requests are decoded one by one, not batched: %s", reason)
        else:
            log.info("batched decode with %s padding (%s)", self.side, reason)
        self._shared = {
            key for key in self.plan.states if pipeline.kv_sharing.get(key.split(".", 1)[0])
        }

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
            side, reason = padding_side(comp, self.pipeline._paths[comp], self.plan.states)
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

    def prefill(
        self, caller: Mapping[str, Any], capacity: int, hit: Hit | None = None
    ) -> tuple[np.ndarray, Cohort]:
        """Run a request's prompt alone; returns its last logits row and its cohort of one.

        ``hit``: kept KV rows of the prompt's first ``hit.length`` ids
        (:mod:`mobius_runtime.prefix_cache`); only the rest of the prompt is prefilled.
        """
        prompt = int(np.shape(caller["input_ids"])[1])
        state, past = None, 0
        if hit is not None:
            state, past = {}, hit.length
            for key, (array, kind) in hit.values.items():
                if key in self._shared:  # in-place buffers are capacity long
                    array = _pad(array, capacity, RIGHT)
                state[key] = to_ortvalue(np.ascontiguousarray(array), kind, self.executor.device)
            caller = {**caller, "input_ids": np.asarray(caller["input_ids"])[:, past:]}
        values = self.executor.step(caller, state, past, capacity)
        logits = last_position(values[self.plan.logits])[0]
        state = self.executor.next_state(values)
        return logits, Cohort(state, [prompt], [capacity], bool(self._shared))

    def rows(self, cohort: Cohort, length: int) -> dict[str, tuple[np.ndarray, str]]:
        """A copy of a one-row cohort's first ``length`` positions, as a prefix cache keeps them."""
        out = {}
        for key, value in cohort.values.items():
            array = np.take(to_numpy(value), np.arange(length), axis=SEQ_AXIS)
            out[key] = (array, value.data_type())
        return out

    def decode(self, cohort: Cohort, tokens: Sequence[int]) -> np.ndarray:
        """One step of every row (``tokens[b]`` is row b's new id); returns logits [B, V]."""
        rows = cohort.size
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
        values = self.executor.step(
            {"input_ids": ids}, cohort.values, length, cohort.capacity, generated
        )
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
