"""Pipeline contracts: the sub-models of a package, their ports and the dataflow between them.

A multi-model package (embedding → decoder, vision/audio encoders, a KV-cache loop)
is a small dataflow program. The contract says it once — which component feeds
which port, what the caller supplies, what carries over between decode steps, what
an absent modality is replaced with — so the runtime, the test harness and the
examples never wire inputs by hand. :func:`validate` checks a contract against the
graphs it describes at build time and lists *every* violation, so a port such as
``per_layer_inputs`` cannot be silently left unfed.

Endpoints are written ``"component.port"``; component names contain no dot, port
names may (``present.0.key``). Dtypes are the names of
:data:`mobius.dtypes.PORT_DTYPES`; symbolic dims are strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mobius.contract_runtime import (
    initial_dims,
    presence_problems,
    zero_fill_problems,
)
from mobius.dtypes import PORT_DTYPES
from mobius.errors import ContractError

if TYPE_CHECKING:
    import onnx_ir as ir

Dim = int | str
"""A static size (int) or a symbolic dim name (str)."""

DTYPES = PORT_DTYPES
EXTERNAL_KINDS = ("caller", "generated")
GENERATED_INPUTS = ("attention_mask", "position_ids")


def _tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(value) if not isinstance(value, tuple) else value


@dataclass(frozen=True)
class Port:
    """One graph input or output: its name, dtype name and shape (ints and symbolic strings)."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _tuple(self.shape))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Component:
    """A sub-model. ``presence`` (``"image"``, ``"audio"``) means it runs only with that modality."""

    name: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    presence: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", _tuple(self.inputs))
        object.__setattr__(self, "outputs", _tuple(self.outputs))

    def input(self, name: str) -> Port | None:
        return next((p for p in self.inputs if p.name == name), None)

    def output(self, name: str) -> Port | None:
        return next((p for p in self.outputs if p.name == name), None)


@dataclass(frozen=True)
class Edge:
    """``producer`` output feeds ``consumer`` input, both ``"component.port"``."""

    producer: str
    consumer: str


@dataclass(frozen=True)
class StateEdge:
    """A loop edge: ``producer`` output of one step becomes ``consumer`` input of the next.

    The first step is fed zeros of ``initial_shape`` (e.g. ``("batch", 2, 0, 16)``).
    """

    producer: str
    consumer: str
    initial_shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial_shape", _tuple(self.initial_shape))


@dataclass(frozen=True)
class ExternalInput:
    """``consumer`` is fed from outside: by the caller/processors (``kind="caller"``,
    e.g. ``input_ids``) or made by the runtime (``kind="generated"``: ``attention_mask``,
    ``position_ids``)."""

    consumer: str
    name: str
    kind: str = "caller"


@dataclass(frozen=True)
class OptionalInput:
    """When modality ``presence`` is absent, ``consumer`` is fed zeros of ``absent_shape``."""

    consumer: str
    presence: str
    absent_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "absent_shape", _tuple(self.absent_shape))


@dataclass(frozen=True)
class Contract:
    """The whole dataflow of a package. See the module docstring."""

    components: tuple[Component, ...]
    edges: tuple[Edge, ...] = ()
    states: tuple[StateEdge, ...] = ()
    externals: tuple[ExternalInput, ...] = ()
    optionals: tuple[OptionalInput, ...] = ()
    outputs: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("components", "edges", "states", "externals", "optionals", "outputs"):
            object.__setattr__(self, name, _tuple(getattr(self, name)))

    def component(self, name: str) -> Component:
        """The component called ``name``; ContractError if there is none."""
        for comp in self.components:
            if comp.name == name:
                return comp
        raise ContractError(
            f"the contract has no component {name!r}",
            where="pipeline contract",
            fix=f"use one of {', '.join(c.name for c in self.components) or '(none)'}",
        )

    # ------------------------------------------------------------------ checks

    def problems(self) -> list[str]:
        """Every self-consistency violation, one line each (empty when consistent)."""
        return _ContractChecker(self).run()

    def check(self) -> None:
        """Raise ContractError listing every self-consistency violation."""
        _raise(self.problems())

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (shapes as lists of int | str)."""
        return {
            "components": [
                {
                    "name": c.name,
                    "inputs": [p.to_dict() for p in c.inputs],
                    "outputs": [p.to_dict() for p in c.outputs],
                    "presence": c.presence,
                }
                for c in self.components
            ],
            "edges": [{"producer": e.producer, "consumer": e.consumer} for e in self.edges],
            "states": [
                {
                    "producer": s.producer,
                    "consumer": s.consumer,
                    "initial_shape": list(s.initial_shape),
                }
                for s in self.states
            ],
            "externals": [
                {"consumer": x.consumer, "name": x.name, "kind": x.kind} for x in self.externals
            ],
            "optionals": [
                {
                    "consumer": o.consumer,
                    "presence": o.presence,
                    "absent_shape": list(o.absent_shape),
                }
                for o in self.optionals
            ],
            "outputs": list(self.outputs),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Contract:
        """Inverse of :meth:`to_dict`; ContractError names the malformed entry."""
        try:
            components = tuple(
                Component(
                    name=str(c["name"]),
                    inputs=tuple(_port(p) for p in c.get("inputs", ())),
                    outputs=tuple(_port(p) for p in c.get("outputs", ())),
                    presence=c.get("presence"),
                )
                for c in data["components"]
            )
            return cls(
                components=components,
                edges=tuple(
                    Edge(str(e["producer"]), str(e["consumer"])) for e in data.get("edges", ())
                ),
                states=tuple(
                    StateEdge(str(s["producer"]), str(s["consumer"]), _shape(s["initial_shape"]))
                    for s in data.get("states", ())
                ),
                externals=tuple(
                    ExternalInput(str(x["consumer"]), str(x["name"]), str(x.get("kind", "caller")))
                    for x in data.get("externals", ())
                ),
                optionals=tuple(
                    OptionalInput(
                        str(o["consumer"]),
                        str(o["presence"]),
                        tuple(int(d) for d in o["absent_shape"]),
                    )
                    for o in data.get("optionals", ())
                ),
                outputs=tuple(str(o) for o in data.get("outputs", ())),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ContractError(
                f"malformed pipeline contract: {type(exc).__name__}: {exc}",
                where="contract (manifest 'contract' entry)",
                fix="rebuild the package with this version of mobius, or fix the contract JSON",
            ) from exc

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Contract:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ContractError(
                f"pipeline contract is not valid JSON: {exc}",
                where="contract",
                fix="rebuild the package or repair the contract JSON",
            ) from exc
        if not isinstance(data, Mapping):
            raise ContractError(
                "pipeline contract JSON is not an object",
                where="contract",
                fix="rebuild the package",
            )
        return cls.from_dict(data)


def _shape(dims: Iterable[Any]) -> tuple[Dim, ...]:
    out: list[Dim] = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, str)):
            raise ValueError(f"dim {d!r} is neither an int nor a symbolic name")
        out.append(d)
    return tuple(out)


def _port(data: Mapping[str, Any]) -> Port:
    return Port(str(data["name"]), str(data["dtype"]), _shape(data["shape"]))


def _fmt(shape: Iterable[Any]) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _raise(problems: list[str]) -> None:
    if not problems:
        return
    lines = "\n".join(f"  - {p}" for p in problems)
    raise ContractError(
        f"pipeline contract has {len(problems)} problem(s):\n{lines}",
        where="pipeline contract (each line names component.port)",
        fix="each line ends with how to fix it; fix the family plugin's contract or graph builder",
    )


class _ContractChecker:
    """Collects every self-consistency violation of one contract."""

    def __init__(self, contract: Contract) -> None:
        self.contract = contract
        self.problems: list[str] = []
        self.by_name: dict[str, Component] = {}

    def add(self, text: str) -> None:
        self.problems.append(text)

    def run(self) -> list[str]:
        self._components()
        sources: dict[str, list[str]] = {
            f"{c.name}.{p.name}": [] for c in self.by_name.values() for p in c.inputs
        }
        for edge in self.contract.edges:
            self._edge(edge.producer, edge.consumer, "edge", sources)
        for state in self.contract.states:
            self._state(state, sources)
        for ext in self.contract.externals:
            self._external(ext, sources)
        for opt in self.contract.optionals:
            self._optional(opt)
        for out in self.contract.outputs:
            self._resolve(out, "output", "contract output")
        self._presence()
        for endpoint, srcs in sources.items():
            if not srcs:
                self.add(
                    f"'{endpoint}' has no source — add an edge from a producer output, a state edge,"
                    " or an external input for it (an optional input needs one too; the zero"
                    " fallback is not a source)"
                )
            elif len(srcs) > 1:
                self.add(
                    f"'{endpoint}' has {len(srcs)} sources ({'; '.join(srcs)}) — keep exactly one"
                )
        return self.problems

    def _components(self) -> None:
        for comp in self.contract.components:
            if comp.name in self.by_name:
                self.add(f"component name '{comp.name}' is used twice — rename one of them")
                continue
            if not comp.name or "." in comp.name:
                self.add(
                    f"component name '{comp.name}' must be non-empty and contain no '.' — rename it"
                )
            self.by_name[comp.name] = comp
            for kind, ports in (("input", comp.inputs), ("output", comp.outputs)):
                seen: set[str] = set()
                for port in ports:
                    where = f"'{comp.name}.{port.name}'"
                    if port.name in seen:
                        self.add(f"{where} is declared twice as an {kind} — remove the duplicate")
                    seen.add(port.name)
                    if port.dtype not in DTYPES:
                        self.add(
                            f"{where} has unknown dtype {port.dtype!r} — use one of {', '.join(DTYPES)}"
                        )
                    for d in port.shape:
                        if isinstance(d, bool) or not isinstance(d, (int, str)):
                            self.add(
                                f"{where} has dim {d!r} in its shape — use ints or symbolic names"
                            )

    def _resolve(self, endpoint: str, kind: str, role: str) -> Port | None:
        """The ``kind`` ("input"/"output") port named by ``endpoint``, or None (problem added)."""
        comp_name, dot, port_name = endpoint.partition(".")
        if not dot or not port_name:
            self.add(f"{role} '{endpoint}' is not written 'component.port' — fix the endpoint")
            return None
        comp = self.by_name.get(comp_name)
        if comp is None:
            self.add(
                f"{role} '{endpoint}' names unknown component '{comp_name}' — use one of "
                f"{', '.join(self.by_name) or '(none)'}"
            )
            return None
        port = comp.input(port_name) if kind == "input" else comp.output(port_name)
        if port is None:
            other = comp.output(port_name) if kind == "input" else comp.input(port_name)
            hint = f" (it is an {'output' if kind == 'input' else 'input'})" if other else ""
            self.add(
                f"{role} '{endpoint}' must be an {kind} of '{comp_name}' but is not{hint} — "
                f"declare it in '{comp_name}'.{kind}s or point the {role} at an existing {kind}"
            )
        return port

    def _compatible(self, label: str, producer: Port, consumer: Port) -> None:
        if producer.dtype != consumer.dtype:
            self.add(
                f"{label} has incompatible dtypes: producer {producer.dtype}, consumer "
                f"{consumer.dtype} — cast in the producer graph or change one port's dtype"
            )
        if len(producer.shape) != len(consumer.shape):
            self.add(
                f"{label} has incompatible ranks: producer rank {len(producer.shape)} "
                f"{_fmt(producer.shape)}, consumer rank {len(consumer.shape)} "
                f"{_fmt(consumer.shape)} — reshape in one graph so both ports have the same rank"
            )
            return
        for axis, (a, b) in enumerate(zip(producer.shape, consumer.shape)):
            if isinstance(a, int) and isinstance(b, int) and a != b:
                self.add(
                    f"{label} has incompatible static dims on axis {axis}: producer {a} "
                    f"{_fmt(producer.shape)}, consumer {b} {_fmt(consumer.shape)} — make the sizes agree"
                )

    def _edge(self, producer: str, consumer: str, role: str, sources: dict[str, list[str]]) -> None:
        label = f"{role} '{producer} -> {consumer}'"
        prod = self._resolve(producer, "output", f"{role} producer")
        cons = self._resolve(consumer, "input", f"{role} consumer")
        if cons is not None:
            sources[consumer].append(f"{role} from '{producer}'")
        if prod is not None and cons is not None:
            self._compatible(f"'{producer} -> {consumer}'" if role == "edge" else label, prod, cons)

    def _state(self, state: StateEdge, sources: dict[str, list[str]]) -> None:
        self._edge(state.producer, state.consumer, "state edge", sources)
        comp_name, _, port_name = state.consumer.partition(".")
        comp = self.by_name.get(comp_name)
        port = comp.input(port_name) if comp is not None else None
        label = f"state edge '{state.producer} -> {state.consumer}'"
        if port is not None and len(state.initial_shape) != len(port.shape):
            self.add(
                f"{label} has initial_shape "
                f"{_fmt(state.initial_shape)} of rank {len(state.initial_shape)} but the port "
                f"{_fmt(port.shape)} has rank {len(port.shape)} — give initial_shape the port's rank"
            )
            return
        try:
            dims = initial_dims(state.initial_shape, 1)
        except ValueError as exc:
            self.add(f"{label} initial_shape {_fmt(state.initial_shape)}: {exc}")
            return
        self._zeros(label, "initial_shape", state.initial_shape, dims)
        for axis, (a, b) in enumerate(zip(state.initial_shape, port.shape if port else ())):
            if isinstance(a, int) and isinstance(b, int) and a != b:
                self.add(
                    f"{label} initial_shape {_fmt(state.initial_shape)} differs from the port's "
                    f"static dim {b} on axis {axis} — use {b} there"
                )

    def _zeros(self, label: str, key: str, shape: tuple[Any, ...], dims: tuple[int, ...]) -> None:
        self.problems.extend(zero_fill_problems(label, key, shape, dims))

    def _presence(self) -> None:
        self.problems.extend(presence_problems(self.contract, self.by_name))

    def _external(self, ext: ExternalInput, sources: dict[str, list[str]]) -> None:
        port = self._resolve(ext.consumer, "input", "external input")
        if port is not None:
            sources[ext.consumer].append(f"external '{ext.name}' ({ext.kind})")
        if ext.kind not in EXTERNAL_KINDS:
            self.add(
                f"external input '{ext.consumer}' has kind {ext.kind!r} — use 'caller' or 'generated'"
            )
        elif ext.kind == "generated" and ext.name not in GENERATED_INPUTS:
            self.add(
                f"external input '{ext.consumer}' is generated as {ext.name!r}, which the runtime "
                f"cannot make — use one of {', '.join(GENERATED_INPUTS)} or kind 'caller'"
            )

    def _optional(self, opt: OptionalInput) -> None:
        port = self._resolve(opt.consumer, "input", "optional input")
        if port is None:
            return
        if len(opt.absent_shape) != len(port.shape):
            self.add(
                f"optional input '{opt.consumer}' has absent_shape {_fmt(opt.absent_shape)} of rank "
                f"{len(opt.absent_shape)} but the port {_fmt(port.shape)} has rank "
                f"{len(port.shape)} — give absent_shape the port's rank"
            )
        for axis, (a, b) in enumerate(zip(opt.absent_shape, port.shape)):
            if isinstance(b, int) and a != b:
                self.add(
                    f"optional input '{opt.consumer}' absent_shape {_fmt(opt.absent_shape)} "
                    f"differs from the port's static dim {b} on axis {axis} — use {b} there"
                )
        label = f"optional input '{opt.consumer}'"
        self._zeros(label, "absent_shape", opt.absent_shape, tuple(opt.absent_shape))


# ---------------------------------------------------------------------- graphs


def _graph_dims(value: ir.Value) -> tuple[int | str | None, ...] | None:
    if value.shape is None:
        return None
    dims: list[int | str | None] = []
    for d in value.shape:
        dims.append(d if isinstance(d, int) else d.value)
    return tuple(dims)


def _check_port(
    problems: list[str], comp: str, kind: str, port: Port, value: ir.Value | None
) -> None:
    from mobius.components.dtypes import dtype_name

    where = f"'{comp}.{port.name}'"
    if value is None:
        problems.append(
            f"{where} is declared as an {kind} in the contract but graph '{comp}' has no {kind} "
            f"of that name — rename the port or add the {kind} to the graph"
        )
        return
    graph_dtype = dtype_name(value.dtype)
    if graph_dtype != port.dtype:
        problems.append(
            f"{where} has dtype {port.dtype} in the contract but {graph_dtype} in graph "
            f"'{comp}' — make the contract and the graph builder agree"
        )
    dims = _graph_dims(value)
    if dims is None:
        return
    if len(dims) != len(port.shape):
        problems.append(
            f"{where} has rank {len(port.shape)} {_fmt(port.shape)} in the contract but rank "
            f"{len(dims)} {_fmt(dims)} in graph '{comp}' — make the contract and the graph agree"
        )
        return
    for axis, (a, b) in enumerate(zip(port.shape, dims)):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            problems.append(
                f"{where} has static dim {a} on axis {axis} in the contract but {b} in graph "
                f"'{comp}' {_fmt(dims)} — make the contract and the graph agree"
            )


def validate(contract: Contract, graphs: Mapping[str, ir.Model]) -> None:
    """Check ``contract`` against itself and the component ``graphs``; raise ContractError
    listing every violation (what, where as ``component.port``, how to fix)."""
    problems = contract.problems()
    names = [c.name for c in contract.components]
    for name in names:
        if name not in graphs:
            problems.append(
                f"component '{name}' has no graph — build it or remove it from the contract"
            )
    for name in graphs:
        if name not in names:
            problems.append(
                f"graph '{name}' is not a component of the contract — declare it or do not build it"
            )
    seen: set[str] = set()
    for comp in contract.components:
        model = graphs.get(comp.name)
        if model is None or comp.name in seen:
            continue
        seen.add(comp.name)
        graph = model.graph
        g_inputs = {v.name: v for v in graph.inputs if v.name}
        g_outputs = {v.name: v for v in graph.outputs if v.name}
        for port in comp.inputs:
            _check_port(problems, comp.name, "input", port, g_inputs.get(port.name))
        for port in comp.outputs:
            _check_port(problems, comp.name, "output", port, g_outputs.get(port.name))
        declared = {p.name for p in comp.inputs}
        for name, value in g_inputs.items():
            if name not in declared and not value.is_initializer():
                problems.append(
                    f"graph '{comp.name}' has input '{name}' that the contract does not declare "
                    f"— add Port('{name}', …) to '{comp.name}'.inputs and give it a source"
                )
    zero_fed = [
        *(
            (f"state edge into '{s.consumer}'", "initial", s.consumer, s.initial_shape)
            for s in contract.states
        ),
        *(
            (f"optional input '{o.consumer}'", "absent", o.consumer, o.absent_shape)
            for o in contract.optionals
        ),
    ]
    for label, key, consumer, shape in zero_fed:
        comp, _, port = consumer.partition(".")
        model = graphs.get(comp)
        value = next((v for v in model.graph.inputs if v.name == port), None) if model else None
        dims = _graph_dims(value) if value is not None else None
        for axis, (a, b) in enumerate(zip(shape, dims or ())):
            if isinstance(a, int) and isinstance(b, int) and a != b:
                problems.append(
                    f"{label} has {key} shape {_fmt(shape)} but graph '{comp}' takes {_fmt(dims)}"
                    f" (axis {axis}: {a} vs {b}) — make the contract and the graph agree"
                )
    _raise(problems)
