"""Ports and pipeline contract of a decoder LM's ``model`` graph, from a few facts.

:class:`LMShape` holds the facts (vocabulary, per layer KV heads and head dim, which
layers reuse another layer's cache); :func:`lm_ports` lists the graph's ports,
:func:`lm_contract` the one-component contract with its KV loop (:func:`kv_states`), and :func:`build_graph`
declares the ports around a family's forward. :func:`kv_port` is the one place that
spells the KV port names (onnxruntime-genai's default decoder names).

Every cache is ``[batch, kv_heads, length, head_dim]`` (BNSH, on both attention paths),
so the ports do not depend on the build target. Port specs are ``(name, dtype, shape)``
with symbolic dims as strings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import OpBuilder

from mobius.components.graph import add_input, add_output, finish_model, new_graph
from mobius.contract import Component, Contract, ExternalInput, Port, StateEdge

PortSpec = tuple[str, str, tuple[int | str, ...]]

BATCH, SEQ, PAST, TOTAL = "batch", "sequence_len", "past_sequence_len", "total_sequence_len"
KV_KINDS = ("key", "value")


def kv_port(i: int, kind: str, *, present: bool = False) -> str:
    """``past_key_values.{i}.{kind}`` (an input), or ``present.{i}.{kind}`` (an output)."""
    return f"present.{i}.{kind}" if present else f"past_key_values.{i}.{kind}"


@dataclass(frozen=True)
class LMShape:
    """``kv_heads[i]`` / ``head_dims[i]``: layer ``i``'s cache geometry; layers in
    ``shared`` read another layer's cache and have no KV ports."""

    vocab_size: int
    kv_heads: tuple[int, ...]
    head_dims: tuple[int, ...]
    shared: frozenset[int] = frozenset()

    @classmethod
    def uniform(cls, vocab_size: int, layers: int, kv_heads: int, head_dim: int) -> LMShape:
        """Every layer owns a ``[batch, kv_heads, T, head_dim]`` cache."""
        return cls(vocab_size, (kv_heads,) * layers, (head_dim,) * layers)

    @property
    def cache_layers(self) -> tuple[int, ...]:
        """The layers with KV ports, in order."""
        return tuple(i for i in range(len(self.kv_heads)) if i not in self.shared)

    def kv_shape(self, i: int, length: int | str) -> tuple[int | str, ...]:
        return (BATCH, self.kv_heads[i], length, self.head_dims[i])


def lm_ports(
    shape: LMShape, dtype: str, logits: str = "all"
) -> tuple[list[PortSpec], list[PortSpec]]:
    """``(inputs, outputs)``: ids, mask, positions and past K/V in; logits and presents out.

    ``logits="last"``: the logits of the last position only (``[batch, 1, vocab]``), all a
    generation reads; ``"all"``: every position (``[batch, sequence, vocab]``)."""
    inputs: list[PortSpec] = [
        ("input_ids", "int64", (BATCH, SEQ)),
        ("attention_mask", "int64", (BATCH, TOTAL)),
        ("position_ids", "int64", (BATCH, SEQ)),
    ]
    positions = 1 if logits == "last" else SEQ
    outputs: list[PortSpec] = [("logits", dtype, (BATCH, positions, shape.vocab_size))]
    for i in shape.cache_layers:
        for kind in KV_KINDS:
            inputs.append((kv_port(i, kind), dtype, shape.kv_shape(i, PAST)))
            outputs.append((kv_port(i, kind, present=True), dtype, shape.kv_shape(i, TOTAL)))
    return inputs, outputs


def lm_contract(
    shape: LMShape, dtype: str, component: str = "model", logits: str = "all"
) -> Contract:
    """One ``component`` whose presents feed its pasts (first fed a 0-length cache); the
    caller gives ``input_ids``, the runtime generates ``attention_mask`` / ``position_ids``;
    ``logits`` as for :func:`lm_ports`."""
    ins, outs = lm_ports(shape, dtype, logits)
    return Contract(
        components=(Component(component, to_ports(ins), to_ports(outs)),),
        states=kv_states(shape, component),
        externals=(
            ExternalInput(f"{component}.input_ids", "input_ids", "caller"),
            ExternalInput(f"{component}.attention_mask", "attention_mask", "generated"),
            ExternalInput(f"{component}.position_ids", "position_ids", "generated"),
        ),
        outputs=(f"{component}.logits",),
    )


def kv_states(shape: LMShape, component: str) -> tuple[StateEdge, ...]:
    """The KV loop of ``component``: each ``present.{i}.*`` feeds ``past_key_values.{i}.*``
    at the next step, first fed a ``[batch, kv_heads, 0, head_dim]`` cache."""
    return tuple(
        StateEdge(
            f"{component}.{kv_port(i, kind, present=True)}",
            f"{component}.{kv_port(i, kind)}",
            shape.kv_shape(i, 0),
        )
        for i in shape.cache_layers
        for kind in KV_KINDS
    )


def to_ports(specs: Sequence[PortSpec]) -> tuple[Port, ...]:
    """Contract :class:`~mobius.contract.Port` objects of port specs."""
    return tuple(Port(n, d, tuple(s)) for n, d, s in specs)


def build_graph(
    name: str,
    inputs: Sequence[PortSpec],
    outputs: Sequence[PortSpec],
    forward: Callable[[OpBuilder, dict[str, ir.Value]], Mapping[str, ir.Value]],
) -> ir.Model:
    """A model whose graph declares ``inputs``, runs ``forward(op, {name: value})`` and
    names each of ``outputs`` from the mapping it returns (dtype and shape as specified)."""
    graph, builder, op = new_graph(name)
    ins = {n: add_input(builder, n, dtype, shape) for n, dtype, shape in inputs}
    values = forward(op, ins)
    for n, dtype, shape in outputs:
        add_output(builder, values[n], n, dtype=dtype, shape=shape)
    return finish_model(graph, builder=builder)
