"""Running one step of a contract: feeds resolved, components run in order.

A step takes the caller's arrays (``input_ids``, ``pixel_values`` …), the state
carried from the previous step (OrtValues) and the past length, and returns
every output as an OrtValue keyed ``component.port``. Values move between
components and between steps as OrtValues through IO binding, so KV caches
never roundtrip through numpy and, on CUDA, stay on the device; only the
contract's declared outputs (logits) are bound to host memory.

KV state has two modes (see :mod:`mobius_runtime.kvshare`). Shared: when every state
edge of a component is a GroupQueryAttention past/present pair and the caller gives
a ``capacity`` (the generation's maximum length), the state is one preallocated
``[B, kvh, capacity, hd]`` OrtValue per port, bound as both the past input and the
present output, so a step writes only its new rows (O(new tokens)). Concat (every
other graph, e.g. ONNX ``Attention`` builds, and ``forward()``): the present OrtValue
a step returns is the next step's past, without numpy copies, but the op itself
builds ``present = concat(past, new)``, so each step's cost is O(cache) and a
generation's O(n²).

Thread safety: an Executor is shared by all requests of a Pipeline. It keeps no
per-request state: a request's IO bindings, kept from step to step, live in its own
:class:`Steps`; the only shared mutable members (per-component caches) are filled
under a lock.

Every input is resolved *before* any session runs: a required input without a
source is a :class:`RequestError`, never silently zero-filled.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mobius_runtime.errors import RequestError
from mobius_runtime.feeds import ORT_TO_NUMPY, cpu_value, to_ortvalue, zeros
from mobius_runtime.iobind import StepBinding
from mobius_runtime.kvshare import SEQ_AXIS, SharePlan
from mobius_runtime.plan import Plan


class Executor:
    """Executes a :class:`Plan` with sessions opened on demand by ``session_of``."""

    def __init__(
        self,
        plan: Plan,
        session_of: Callable[[str], Any],
        device: str,
        share_of: Callable[[str], SharePlan | None] | None = None,
    ) -> None:
        self.plan = plan
        self.session_of = session_of
        self.device = device
        self.share_of = share_of
        self._io: dict[str, tuple[list[tuple[str, str, tuple[Any, ...]]], list[str]]] = {}
        self._share: dict[str, SharePlan | None] = {}
        self._resolved: dict[tuple, list[_Layout]] = {}
        self._lock = threading.Lock()

    def io(self, comp: str) -> tuple[list[tuple[str, str, tuple[Any, ...]]], list[str]]:
        """(inputs as (name, type, shape), output names) of a component's session, cached."""
        cached = self._io.get(comp)
        if cached is None:
            session = self.session_of(comp)
            inputs = [(a.name, a.type, tuple(a.shape or ())) for a in session.get_inputs()]
            cached = (inputs, [o.name for o in session.get_outputs()])
            with self._lock:
                self._io.setdefault(comp, cached)
        return cached

    def shared(self, comp: str) -> SharePlan | None:
        """The component's KV buffer-sharing plan (None: concat path), decided once."""
        if self.share_of is None:
            return None
        if comp not in self._share:
            found = self.share_of(comp)
            with self._lock:
                self._share.setdefault(comp, found)
        return self._share[comp]

    # ------------------------------------------------------------------ resolution

    def active_modalities(self, caller: Mapping[str, Any]) -> set[str]:
        """Presence keys whose components receive a caller input in this request."""
        present = set()
        for name in caller:
            for consumer in self.plan.caller_names.get(name, ()):
                presence = self.plan.presence[consumer.split(".", 1)[0]]
                if presence:
                    present.add(presence)
        return present

    def check_request(self, caller: Mapping[str, Any]) -> None:
        """Unknown caller inputs are an error naming what the package accepts."""
        unknown = sorted(set(caller) - set(self.plan.caller_names))
        if unknown:
            raise RequestError(
                f"unknown input(s) {', '.join(unknown)}",
                where="forward()/generate() inputs",
                fix="this package takes: " + ", ".join(sorted(self.plan.caller_names)),
            )

    def _resolve(
        self, caller: Mapping[str, Any], state: Mapping[str, Any] | None
    ) -> tuple[list[str], dict[str, tuple[str, Any]]]:
        """Which components run and where each of their inputs comes from.

        Returns (components to run, key -> (how, detail)); raises for inputs
        without a source before anything runs.
        """
        present = self.active_modalities(caller)
        run = [
            name
            for name in self.plan.order
            if self.plan.presence[name] is None or self.plan.presence[name] in present
        ]
        running = set(run)
        how: dict[str, tuple[str, Any]] = {}
        missing: list[str] = []
        for key, source in self.plan.sources.items():
            comp = key.split(".", 1)[0]
            if comp not in running:
                continue
            fallback = self.plan.fallbacks.get(key)
            absent = fallback is not None and fallback.presence not in present
            if source.kind == "caller":
                if source.ref in caller:
                    how[key] = ("caller", source.ref)
                elif absent:
                    how[key] = ("zeros", fallback.shape)
                else:
                    missing.append(f"{key} (caller input {source.ref!r})")
            elif source.kind == "edge":
                if source.ref.split(".", 1)[0] in running:
                    how[key] = ("edge", source.ref)
                elif absent:
                    how[key] = ("zeros", fallback.shape)
                else:
                    missing.append(f"{key} (from {source.ref}, which does not run)")
            elif source.kind == "state":
                if state is not None and key in state:
                    how[key] = ("state", key)
                else:
                    how[key] = ("initial", source.initial_shape)
            else:
                how[key] = ("generated", source.ref)
        if missing:
            raise RequestError(
                "required input(s) have no value in this request: " + "; ".join(missing),
                where="contract inputs",
                fix="pass the missing input(s) (see the package's contract externals); "
                "required inputs are never zero-filled",
            )
        return run, how

    # ------------------------------------------------------------------ running

    def layout(self, caller: Mapping[str, Any], state: Mapping[str, Any] | None) -> list[_Layout]:
        """The components a step with these caller inputs and state keys runs, each with its
        inputs' sources: resolved (and checked) once per such shape, then cached."""
        shape = (frozenset(caller), None if state is None else frozenset(state))
        layout = self._resolved.get(shape)
        if layout is None:
            self.check_request(caller)
            run, how = self._resolve(caller, state)
            host = set(self.plan.outputs)
            layout = []
            for comp in run:
                inputs, names = self.io(comp)
                feeds = tuple(
                    (name, f"{comp}.{name}", ort_type, len(dims), how[f"{comp}.{name}"])
                    for name, ort_type, dims in inputs
                )
                outs = tuple(
                    (name, f"{comp}.{name}", self.device == "cpu" or f"{comp}.{name}" in host)
                    for name in names
                )
                layout.append(_Layout(comp, feeds, outs))
            with self._lock:
                layout = self._resolved.setdefault(shape, layout)
        return layout

    def steps(self, capacity: int | None = None, recycle: frozenset[str] = frozenset()) -> Steps:
        """A request's run of steps (see :class:`Steps`)."""
        return Steps(self, capacity, recycle)

    def step(
        self,
        caller: Mapping[str, Any],
        state: Mapping[str, Any] | None,
        past_len: int,
        capacity: int | None = None,
        generated: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """Run one step on bindings of its own; see :meth:`Steps.step`."""
        return Steps(self, capacity).step(caller, state, past_len, generated)

    def next_state(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The state for the next step: each state edge's producer value."""
        return {consumer: values[producer] for consumer, producer in self.plan.states.items()}


@dataclass(frozen=True)
class _Layout:
    """One component of a resolved step: its inputs as (name, key, type, rank, source) and
    its outputs as (name, key, bound to host memory)."""

    comp: str
    inputs: tuple[tuple[str, str, str, int, tuple[str, Any]], ...]
    outputs: tuple[tuple[str, str, bool], ...]


@dataclass(frozen=True)
class _Prepared:
    """A :class:`_Layout` part made ready for a request's steps: its binding, its inputs
    (the layout's, each with whether it is a shared KV buffer), the outputs bound to a
    each output as (name, the past buffer it is bound to or None, the device the run
    allocates it on otherwise), each output's key with that past, and the indices of the
    bound ones."""

    part: _Layout
    binding: StepBinding
    inputs: tuple[tuple[str, str, str, int, tuple[str, Any], bool], ...]
    outputs: tuple[tuple[str, str | None, str], ...]
    keys: tuple[tuple[str, str | None], ...]
    skip: frozenset[int]
    # what Steps.step does with them: the shared-buffer inputs; the state inputs that
    # are not shared buffers, as (name, state key); the other inputs, each with what a
    # step does with it (_CALLER, ...: Steps._bind_others); a picker of the state values
    # bound as shared buffers (None: some come from elsewhere); the outputs the run
    # allocates (name, device) and their (index, key)
    pairs: tuple[tuple[str, str, str, int, tuple[str, Any], bool], ...] = ()
    states: tuple[tuple[str, str], ...] = ()
    others: tuple[tuple[str, str, str, int, tuple[str, Any], int], ...] = ()
    held: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
    fresh: tuple[tuple[str, str], ...] = ()
    fresh_keys: tuple[tuple[int, str], ...] = ()
    closed: bool = False  # its whole next state is its shared buffers (Steps.state_kept)
    # the fresh outputs Steps.recycle names, as (index, name, key); the rest of ``fresh``
    # and ``fresh_keys``; and the indices a run need not wrap when those are recycled
    recycled: tuple[tuple[int, str, str], ...] = ()
    fresh_rest: tuple[tuple[str, str], ...] = ()
    fresh_rest_keys: tuple[tuple[int, str], ...] = ()
    recycled_skip: frozenset[int] = frozenset()


# what a steady step does with an input that is not a shared buffer (_Prepared.others)
_CALLER, _MASK, _POSITION, _OTHER = range(4)


class Steps:
    """The steps of one request (a prefill, then one per token), each component's IO
    binding kept from one step to the next.

    What is the same OrtValue as at the last step stays bound without a call: the shared
    KV buffers (past and present), and a caller's numpy input that the OrtValue reads in
    place (host memory, the session's dtype) when the next step passes the same array
    object, written in place (the token loop's ``[1, 1]`` ids). The runtime's
    ``attention_mask`` (ones) and ``position_ids`` are views of arrays made once per
    request and grown as needed, so a step allocates no numpy array for them. A step
    whose shared buffers are the very state values of the step before (every decode
    step of a request on them) does not visit them at all: one C-level pick of those
    values, compared by identity, stands for the per-port loop (Gemma 3 270M: 36 of its
    39 inputs and 37 outputs). One thread drives a request: a Steps is never shared.

    ``recycle``: output keys (the token loop's logits) that a steady step writes into the
    OrtValue the same part's previous steady step returned under that key, when the
    step has the same batch and sequence length (the key's shape must follow from those
    two alone, which the caller checks from the graph): no output is allocated, wrapped
    or bound anew for it, and the caller may keep its numpy view. The value a step
    returns for such a key is therefore overwritten by the next steady step: only a
    caller that is done with it by then (the token loop, which picks from the logits
    before it steps again) may ask for it.
    """

    def __init__(
        self, executor: Executor, capacity: int | None = None, recycle: frozenset[str] = frozenset()
    ) -> None:
        self.executor = executor
        self.capacity = capacity
        self.recycle = recycle
        # comp -> ((batch, seq) of the step that made them, the recycled outputs as
        # (name, OrtValue), and as key -> OrtValue)
        self._recycled: dict[str, tuple[tuple[int, int], tuple[tuple[str, Any], ...], dict]] = {}
        self._bindings: dict[str, StepBinding] = {}
        self._prepared: dict[str, _Prepared] = {}  # comp -> its layout part, made ready once
        self._arrays: dict[str, tuple[Any, Any]] = {}  # key -> (caller array, OrtValue over it)
        self._rooms: dict[str, tuple[Any, int]] = {}  # key -> (shared buffer, its positions)
        # comp -> (its prepared part, the state values bound as its shared buffers, those
        # buffers by input name, the step values they give, the fewest positions of them)
        self._steady: dict[str, tuple[Any, tuple[Any, ...], dict, dict, int]] = {}
        self._last_layout: tuple[frozenset, frozenset, list[_Layout]] | None = None
        self.state_kept = False
        """True after a step whose next state is the very state it was given (every part
        took the steady path and all its state lives in shared buffers): a caller may keep
        passing that same mapping instead of :meth:`Executor.next_state` of the values."""
        self._ones = np.ones(0, dtype=np.int64)
        self._ones_at = 0  # the address of self._ones (StepBinding.input_host)
        self._ramp = np.arange(0, dtype=np.int64)
        self._position = np.zeros((1, 1), dtype=np.int64)  # a one-token step's, written in place

    def step(
        self,
        caller: Mapping[str, Any],
        state: Mapping[str, Any] | None,
        past_len: int,
        generated: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """Run one step; returns every component output (OrtValue) keyed ``comp.port``.

        The request's ``capacity`` (the most positions it will ever hold) enables shared
        KV buffers for components whose graphs allow it; ``None`` keeps the concat
        path. A request uses one mode for all its steps: the state a shared step
        returns is the capacity-long buffers. ``generated`` replaces the runtime's
        ``attention_mask`` / ``position_ids`` (by name) for a batch whose rows have
        different past lengths (:mod:`mobius_runtime.batching`); ``past_len`` is then
        the longest row's.
        """
        batch, seq = _batch_and_seq(caller)
        needed = past_len + seq
        values: dict[str, Any] = {}
        kept = state is not None
        for part in self._layout(caller, state):
            ready = self._prepared.get(part.comp)
            if ready is None or ready.part is not part:
                ready = self._prepared[part.comp] = self._prepare(part)
            binding = ready.binding
            bound_out = binding.bound_outputs
            steady = self._steady.get(part.comp)
            if (
                steady is not None
                and steady[0] is ready
                and state is not None
                and needed <= steady[4]
                and all(map(operator.is_, ready.held(state), steady[1]))
            ):  # the same shared buffers as the last step, bound in and out already
                self._bind_others(ready, caller, state, values, batch, seq, past_len, generated)
                values.update(steady[3])
                recycled = self._recycled.get(part.comp) if ready.recycled else None
                if recycled is not None and recycled[0] == (batch, seq):
                    # the recycled outputs: the previous steady step's OrtValues again
                    for name, value in recycled[1]:
                        if bound_out.get(name) is not value:
                            binding.output(name, value)
                    binding.outputs_on(ready.fresh_rest)
                    outputs = binding.run(ready.recycled_skip)
                    values.update(recycled[2])
                    for i, key in ready.fresh_rest_keys:
                        values[key] = outputs[i]
                else:
                    binding.outputs_on(ready.fresh)
                    outputs = binding.run(ready.skip)
                    for i, key in ready.fresh_keys:
                        values[key] = outputs[i]
                    if ready.recycled:
                        self._recycled[part.comp] = (
                            (batch, seq),
                            tuple((name, outputs[i]) for i, name, _ in ready.recycled),
                            {key: outputs[i] for i, _, key in ready.recycled},
                        )
                kept = kept and ready.closed
                continue
            kept = False
            self._recycled.pop(part.comp, None)  # recycled on consecutive steady steps only
            # a step that fails half way may leave other buffers bound: no steady path
            # until a whole general step has run again
            self._steady.pop(part.comp, None)
            rooms = self._rooms
            buffers: dict[str, Any] = {}
            # the shared KV buffers: what is the very value bound last step is skipped
            # without a call (as the ids written in place, in _bind_others)
            for name, key, ort_type, _, how, _ in ready.pairs:
                value = self._buffer(key, ort_type, how, state, batch)
                room = rooms.get(key)
                if room is None or room[0] is not value or needed > room[1]:
                    self._check_room(key, value, needed)
                buffers[name] = value
                binding.input(name, value)
            self._bind_others(ready, caller, state, values, batch, seq, past_len, generated)
            # in graph order: onnxruntime returns the outputs in the order of their first
            # binding, which this one may be
            if not buffers:
                binding.outputs_on(ready.fresh)  # every output (ready.fresh is in that order)
            for name, past, device in ready.outputs if buffers else ():
                if past is None:
                    binding.output_on(name, device)
                elif bound_out.get(name) is not buffers[past]:
                    binding.output(name, buffers[past])
            for (key, past), value in zip(ready.keys, binding.run(ready.skip)):
                # a shared present *is* its past buffer: keep that very OrtValue
                values[key] = value if past is None else buffers[past]
            if ready.held is not None and state is not None:
                self._steady[part.comp] = (
                    ready,
                    ready.held(state),
                    buffers,
                    {key: buffers[past] for key, past in ready.keys if past is not None},
                    min(rooms[key][1] for _, key, *_ in ready.pairs),
                )
        self.state_kept = kept
        return values

    def _bind_others(
        self,
        ready: _Prepared,
        caller: Mapping[str, Any],
        state: Mapping[str, Any] | None,
        values: Mapping[str, Any],
        batch: int,
        seq: int,
        past_len: int,
        generated: Mapping[str, np.ndarray] | None,
    ) -> None:
        """Bind a part's inputs that are not shared buffers: its state (the concat path's
        past, a new OrtValue at every step) in one loop, then the rest by kind; what is
        bound already (the ids written in place, the one-token position) is skipped."""
        binding = ready.binding
        if ready.states:
            binding.inputs_from(state, ready.states)  # type: ignore[arg-type]
        bound_in, arrays = binding.bound_inputs, self._arrays
        needed = past_len + seq
        one_token = generated is None and batch == 1 and seq == 1
        for name, key, ort_type, rank, how, code in ready.others:
            if code == _CALLER or (code == _POSITION and one_token):
                # the token loop's ids, or the one-token position: arrays written in place,
                # so the OrtValue over them from the last step is the one bound already
                if code == _CALLER:
                    array = caller[how[1]]
                else:
                    self._position[0, 0] = past_len
                    array = self._position
                known = arrays.get(key)
                if known is not None and known[0] is array:
                    value = known[1]
                else:
                    value = self._value(key, array, ort_type)
            elif code == _MASK and generated is None:  # a view of the ones, by address
                if self._ones.size < batch * needed:
                    self._grow_ones(batch, needed)
                mask = self._ones[: batch * needed].reshape(batch, needed)
                binding.input_host(name, mask, self._ones_at)
                continue
            else:
                value = self._feed(
                    key, ort_type, rank, how, caller, state, values, batch, seq, past_len,
                    generated,
                )  # fmt: skip
            if bound_in.get(name) is not value:
                binding.input(name, value)

    def _layout(self, caller: Mapping[str, Any], state: Mapping[str, Any] | None) -> list[_Layout]:
        """:meth:`Executor.layout`, the last one reused when this step has the last step's
        caller input names and state keys (a concat build's state is a new mapping at
        every step: its keys, not its identity, decide)."""
        last = self._last_layout
        if (
            last is not None
            and state is not None
            and caller.keys() == last[0]
            and state.keys() == last[1]
        ):
            return last[2]
        layout = self.executor.layout(caller, state)
        if state is not None:
            self._last_layout = (frozenset(caller), frozenset(state), layout)
        return layout

    def _prepare(self, part: _Layout) -> _Prepared:
        """``part``'s binding and its inputs and outputs sorted by what a step does with
        them (computed once per request and layout, not at every step)."""
        executor = self.executor
        binding = self._bindings.get(part.comp)
        if binding is None:
            binding = self._bindings[part.comp] = StepBinding(executor.session_of(part.comp))
        share = executor.shared(part.comp) if self.capacity is not None else None
        pairs = share.pairs if share is not None else {}
        bound = share.outputs if share is not None else {}
        inputs = tuple((*spec, spec[0] in pairs) for spec in part.inputs)
        on = {True: "cpu", False: executor.device}
        outputs = tuple((name, bound.get(name), on[host]) for name, _, host in part.outputs)
        keys = tuple((key, bound.get(name)) for name, key, _ in part.outputs)
        shared = tuple(spec for spec in inputs if spec[5])
        held = None  # every shared buffer comes from the state: a step may find them unchanged
        if shared and all(spec[4][0] == "state" for spec in shared):
            state_keys = [spec[4][1] for spec in shared]
            pick = operator.itemgetter(*state_keys)
            held = pick if len(state_keys) > 1 else (lambda state, pick=pick: (pick(state),))
        # the part's next state is its shared buffers alone: nothing of the state comes from
        # elsewhere and every state edge it feeds is a shared output
        produced = {
            producer
            for producer in executor.plan.states.values()
            if producer.split(".", 1)[0] == part.comp
        }
        closed = (
            held is not None
            and not any(spec[4][0] == "state" for spec in inputs if not spec[5])
            and produced <= {key for key, past in keys if past is not None}
        )
        skip = frozenset(i for i, (name, _, _) in enumerate(part.outputs) if name in bound)
        fresh = tuple(
            (i, name, device) for i, (name, past, device) in enumerate(outputs) if past is None
        )
        recycled = tuple(
            (i, name, keys[i][0]) for i, name, _ in fresh if keys[i][0] in self.recycle
        )
        again = {i for i, _, _ in recycled}
        return _Prepared(
            part,
            binding,
            inputs,
            outputs=outputs,
            keys=keys,
            skip=skip,
            pairs=shared,
            states=tuple(
                (spec[0], spec[4][1]) for spec in inputs if not spec[5] and spec[4][0] == "state"
            ),
            others=tuple(
                (*spec[:5], self._code(spec))
                for spec in inputs
                if not spec[5] and spec[4][0] != "state"
            ),
            held=held,
            fresh=tuple((name, device) for _, name, device in fresh),
            fresh_keys=tuple((i, keys[i][0]) for i, _, _ in fresh),
            closed=closed,
            recycled=recycled,
            fresh_rest=tuple((name, device) for i, name, device in fresh if i not in again),
            fresh_rest_keys=tuple((i, keys[i][0]) for i, _, _ in fresh if i not in again),
            recycled_skip=skip | again,
        )

    def _code(self, spec: tuple[str, str, str, int, tuple[str, Any], bool]) -> int:
        """What a steady step does with input ``spec`` (not a shared buffer): the runtime's
        mask and one-token positions have paths of their own on the host (int64, rank 2;
        anything else goes through :meth:`_feed`, which checks it)."""
        _, _, ort_type, rank, (kind, detail), _ = spec
        if kind == "caller":
            return _CALLER
        host_int64 = self.executor.device == "cpu" and ort_type == "tensor(int64)" and rank == 2
        if kind == "generated" and host_int64:
            if detail == "attention_mask":
                return _MASK
            if detail == "position_ids":
                return _POSITION
        return _OTHER

    def _grow_ones(self, batch: int, total: int) -> None:
        """Ones for a ``[batch, total]`` mask: the request's capacity at once, else (the
        concat path has none) at least twice as many as before, so that a decode step
        does not allocate them anew (it did at every step of a concat build)."""
        size = max(batch * max(total, self.capacity or 0), 2 * self._ones.size)
        self._ones = np.ones(size, dtype=np.int64)
        self._ones_at = self._ones.ctypes.data

    def _check_room(self, key: str, buffer: Any, needed: int) -> None:
        """A shared buffer must hold every position of this step (the request's capacity);
        a buffer's length is read once (it is the same OrtValue from step to step)."""
        known = self._rooms.get(key)
        if known is None or known[0] is not buffer:
            known = self._rooms[key] = (buffer, int(buffer.shape()[SEQ_AXIS]))
        if needed > known[1]:
            raise RequestError(
                f"{key}: this step needs {needed} cache positions, the request's KV buffer "
                f"has {known[1]}",
                where=key,
                fix="pass a capacity of at least prompt length + max_new_tokens to step()",
            )

    def _buffer(
        self,
        key: str,
        ort_type: str,
        how: tuple[str, Any],
        state: Mapping[str, Any] | None,
        batch: int,
    ) -> Any:
        """A shared KV buffer: the request's own from the last step, or a new zeroed one."""
        kind, detail = how
        if kind == "state":
            return state[detail]  # type: ignore[index]
        shape = list(_initial_shape(key, detail, batch))
        shape[SEQ_AXIS] = int(self.capacity)  # type: ignore[arg-type]
        return zeros(tuple(shape), ort_type, self.executor.device)

    def _feed(
        self,
        key: str,
        ort_type: str,
        rank: int,
        how: tuple[str, Any],
        caller: Mapping[str, Any],
        state: Mapping[str, Any] | None,
        values: Mapping[str, Any],
        batch: int,
        seq: int,
        past_len: int,
        generated: Mapping[str, np.ndarray] | None = None,
    ) -> Any:
        kind, detail = how
        device = self.executor.device
        if kind == "edge":
            return values[detail]
        if kind == "state":
            return state[detail]  # type: ignore[index]
        if kind == "caller":
            return self._value(key, caller[detail], ort_type)
        if kind == "zeros":
            return zeros(tuple(detail), ort_type, device)
        if kind == "initial":
            return zeros(_initial_shape(key, detail, batch), ort_type, device)
        if generated is not None and detail in generated:
            return to_ortvalue(generated[detail], ort_type, device)
        return self._value(key, self._generated(key, detail, rank, batch, seq, past_len), ort_type)

    def _value(self, key: str, value: Any, ort_type: str) -> Any:
        """An input array as an OrtValue: the one of the last step when ``value`` is the same
        host array and that OrtValue reads it in place (so it is bound already)."""
        known = self._arrays.get(key)
        if known is not None and known[0] is value:
            return known[1]
        is_array = isinstance(value, np.ndarray)
        if not is_array and hasattr(value, "data_type") and value.data_type() == ort_type:
            return value
        if (
            is_array
            and self.executor.device == "cpu"
            and value.size
            and ort_type != "tensor(bfloat16)"
            and value.dtype == ORT_TO_NUMPY.get(ort_type)
            and value.flags.c_contiguous
        ):  # the OrtValue reads the array in place (the mask's view of ones at every step)
            converted = cpu_value(value)
            self._arrays[key] = (value, converted)
            return converted
        converted = to_ortvalue(value, ort_type, self.executor.device)
        if (
            isinstance(value, np.ndarray)
            and self.executor.device == "cpu"
            and value.size
            and converted.data_ptr() == value.ctypes.data
        ):  # the OrtValue reads the array in place: writing it is the next step's feed
            self._arrays[key] = (value, converted)
        return converted

    def _generated(
        self, key: str, name: str, rank: int, batch: int, seq: int, past_len: int
    ) -> np.ndarray:
        """attention_mask = ones(B, P+S); position_ids = arange(P, P+S) per row: views of
        the request's own ones / arange arrays (grown to the capacity, or as needed), and
        for one token of one row its own ``[1, 1]`` array, written in place."""
        total = past_len + seq
        if name == "attention_mask":
            if rank != 2:
                raise RequestError(
                    f"generated attention_mask for {key} must be rank 2, the graph has rank {rank}",
                    where=key,
                    fix="rebuild the package",
                )
            if self._ones.size < batch * total:
                self._grow_ones(batch, total)
            return self._ones[: batch * total].reshape(batch, total)
        if batch == 1 and seq == 1 and rank == 2:
            self._position[0, 0] = past_len
            return self._position
        if self._ramp.size < total:
            self._ramp = np.arange(max(total, self.capacity or 0), dtype=np.int64)
        positions = self._ramp[past_len:total]
        if rank == 1:
            return positions
        if rank == 2:
            return (
                positions.reshape(1, seq)
                if batch == 1
                else np.broadcast_to(positions, (batch, seq))
            )
        raise RequestError(
            f"generated position_ids for {key} must be rank 1 or 2, the graph has rank {rank}",
            where=key,
            fix="rebuild the package",
        )


def _batch_and_seq(caller: Mapping[str, Any]) -> tuple[int, int]:
    ids = caller.get("input_ids")
    if ids is None:
        ids = caller.get("inputs_embeds")
    if ids is None:
        return 1, 0
    if isinstance(ids, np.ndarray):
        shape: tuple[int, ...] = ids.shape
    else:
        shape = tuple(ids.shape()) if hasattr(ids, "data_type") else np.shape(ids)
    if len(shape) < 2:
        raise RequestError(
            f"input_ids must be [batch, sequence], got shape {list(shape)}",
            where="input_ids",
            fix="pass a 2-D int64 array",
        )
    return int(shape[0]), int(shape[1])


def _initial_shape(key: str, shape: tuple[int | str, ...], batch: int) -> tuple[int, ...]:
    from mobius.contract_runtime import initial_dims

    try:
        return initial_dims(shape, batch)
    except ValueError as exc:
        raise RequestError(
            f"state input {key}: {exc}",
            where=f"mobius.json: contract state {key}",
            fix="rebuild the package; initial shapes may use 'batch' and ints",
        ) from exc
