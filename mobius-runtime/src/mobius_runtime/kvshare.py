"""A component's KV-state layout, read from its graph once: can the state live in
preallocated, shared buffers (:class:`SharePlan`), and on which side are a batch's rows
padded (:class:`KVLayout`, used by :mod:`mobius_runtime.batching`).

ONNX ``Attention`` (and GroupQueryAttention fed a past of exactly the valid length)
returns ``present = concat(past, new)``: every decode step copies the whole cache,
so a generation costs O(n²) copies. ``com.microsoft.GroupQueryAttention`` can
instead write the new K/V in place: onnxruntime 1.31 (CPU and CUDA) treats past and
present as one buffer when both point at the same memory. Measured semantics
(``tests/test_gqa_share_buffer.py`` checks them against numpy):

- ``past_key``/``past_value`` are ``[B, kvh, M, hd]`` buffers of the generation's
  maximum length ``M``; only the first ``P`` positions are valid;
- ``present`` is bound (IO binding) to the very same OrtValue; GQA writes the ``S``
  new rows at offset ``P`` and nothing else;
- ``seqlens_k = P + S - 1`` and ``total_sequence_length = P + S`` — what the
  graph derives from an ``attention_mask`` of ones of length ``P + S`` (the same
  mask the concat path feeds), never from the buffer's length;
- a KV-consumer layer (shared KV) that passes empty K/V with the producer's present
  as its past attends exactly the valid ``P + S`` rows of the max-length buffer.

This module inspects a graph (no weights loaded) and says whether *every* state
edge of a component is such a GQA pair; a single state that is not (an
``Attention`` layer, a past read by anything but a GQA past input, e.g. a
``Shape`` that would see ``M``) keeps the whole component on the concat path,
and the reason is logged at debug level.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("mobius_runtime.kvshare")

GQA_OP = ("com.microsoft", "GroupQueryAttention")
_PAST_KEY, _PAST_VALUE = 3, 4  # GroupQueryAttention input slots
_PRESENT_KEY, _PRESENT_VALUE = 1, 2  # GroupQueryAttention output slots
SEQ_AXIS = 2  # GQA caches are BNSH


@dataclass(frozen=True)
class SharePlan:
    """A component whose state edges all share buffers: consumer port -> producer port."""

    component: str
    pairs: Mapping[str, str]  # past port name -> present port name (both unqualified)

    @property
    def outputs(self) -> dict[str, str]:
        """present port name -> past port name (the buffer it is bound to)."""
        return {present: past for past, present in self.pairs.items()}


LEFT, RIGHT = "left", "right"
_ATTENTION_OP = ("", "Attention")
_PAST_SLOTS = {GQA_OP: ((_PAST_KEY, _PAST_VALUE), RIGHT), _ATTENTION_OP: ((4, 5), LEFT)}


@dataclass(frozen=True)
class KVLayout:
    """How one stateful component's KV state may be laid out, read from its graph once.

    ``share``: its buffer-sharing plan (None: the concat path); ``side``: where a batch's
    rows are padded (``"left"`` / ``"right"``, see :mod:`mobius_runtime.batching`; None:
    its requests cannot share a batched step), ``side_reason`` says why.
    """

    component: str
    share: SharePlan | None
    side: str | None
    side_reason: str


def kv_layout(component: str, path: Path, states: Mapping[str, str]) -> KVLayout:
    """The :class:`KVLayout` of ``component`` (graph at ``path``, read once, no weights).

    ``states`` is the plan's consumer key -> producer key map (``comp.port``).
    """
    import onnx

    try:
        graph: Any = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # unreadable graph: the session load reports it properly
        graph = f"cannot read the graph ({exc})"
    side, why = _padding_side(component, graph, states)
    return KVLayout(component, _share_plan(component, graph, states), side, why)


def _padding_side(component: str, graph: Any, states: Mapping[str, str]) -> tuple[str | None, str]:
    """(``"left"`` | ``"right"`` | None, why) for the state ports of ``component``."""
    prefix = f"{component}."
    ports = [key[len(prefix) :] for key in states if key.startswith(prefix)]
    if any(not states[prefix + port].startswith(prefix) for port in ports):
        return None, "a state edge crosses components"
    if isinstance(graph, str):
        return None, graph
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


def _share_plan(component: str, graph: Any, states: Mapping[str, str]) -> SharePlan | None:
    """The :class:`SharePlan` of ``component``, or None with a debug log.

    ``states`` is the plan's consumer key -> producer key map (``comp.port``); only
    the edges whose both ends are in ``component`` are considered. A component
    without state edges returns None silently.
    """
    prefix = f"{component}."
    pairs = {
        consumer[len(prefix) :]: producer[len(prefix) :]
        for consumer, producer in states.items()
        if consumer.startswith(prefix)
    }
    if not pairs:
        return None
    if any(not states[prefix + past].startswith(prefix) for past in pairs):
        log.debug("%s: a state edge crosses components; KV buffers are not shared", component)
        return None
    reason = graph if isinstance(graph, str) else _why_not(graph, pairs)
    if reason is not None:
        log.debug(
            "%s: KV buffer sharing off, concat path (O(cache) copy per step): %s",
            component,
            reason,
        )
        return None
    log.debug(
        "%s: KV buffer sharing on for %d state ports (GroupQueryAttention)", component, len(pairs)
    )
    return SharePlan(component, dict(pairs))


def _why_not(graph: Any, pairs: Mapping[str, str]) -> str | None:
    """None when every (past, present) pair is one GQA node's in-place cache; else why not."""
    producer = {out: (node, i) for node in graph.node for i, out in enumerate(node.output)}
    readers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, i))
    inputs = {v.name: v for v in graph.input}
    outputs = {v.name for v in graph.output}

    node_of: dict[str, int] = {}  # past port -> id of the GQA node that owns it
    for past, present in pairs.items():
        if past not in inputs or present not in outputs:
            return f"state {present} -> {past} is not a graph output -> input pair"
        dims = inputs[past].type.tensor_type.shape.dim
        if len(dims) != 4:
            return f"{past} has rank {len(dims)}, GroupQueryAttention caches are rank 4"
        found = producer.get(present)
        if found is None:
            return f"{present} is not produced by a node"
        node, slot = found
        if (node.domain, node.op_type) != GQA_OP:
            return f"{present} comes from {node.domain or 'ai.onnx'}.{node.op_type}"
        want = {_PRESENT_KEY: _PAST_KEY, _PRESENT_VALUE: _PAST_VALUE}.get(slot)
        if want is None or len(node.input) <= want or node.input[want] != past:
            return f"{present}: its GroupQueryAttention node does not read {past} as its past"
        node_of[past] = id(node)
        # The past buffer is only ever a GQA past input (a Shape would see M, not P).
        for reader, i in readers.get(past, []):
            if (reader.domain, reader.op_type) != GQA_OP or i not in (_PAST_KEY, _PAST_VALUE):
                return f"{past} is also read by {reader.op_type} (input {i})"
        # The present (the same buffer) may feed KV-consumer layers, as their GQA past only.
        for reader, i in readers.get(present, []):
            if (reader.domain, reader.op_type) != GQA_OP or i not in (_PAST_KEY, _PAST_VALUE):
                return f"{present} is read by {reader.op_type} (input {i}), not a GQA past"
    # onnxruntime shares only when key *and* value of one node are both bound in place.
    for past, present in pairs.items():
        node, slot = producer[present]
        other = node.output[_PRESENT_VALUE if slot == _PRESENT_KEY else _PRESENT_KEY]
        partner = next((p for p, q in pairs.items() if q == other), None)
        if partner is None or node_of.get(partner) != node_of[past]:
            return f"{present}: its node's other present output {other} is not a state edge"
    return None
