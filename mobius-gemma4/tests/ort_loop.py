"""Execute a mobius package's pipeline contract with onnxruntime, step by step.

A deliberately small, independent executor for the parity tests (the runtime
distribution has its own): it reads ``mobius.json``, opens one CPU session per
component and, for each step, runs the components in dependency order feeding

- caller inputs (``input_ids``) from the test,
- generated inputs: ``attention_mask`` = ones ``[B, P+S]``, ``position_ids`` =
  ``arange(P, P+S)``,
- edges from the producer's output of the same step,
- state edges from the previous step's ``present`` (first step: the empty
  ``initial_shape`` tensor, ``batch`` → B, other symbolic dims → 0),
- optional inputs as zeros of ``absent_shape``.

Every session input must get exactly one of those; anything else is an error
that names the port. Tensors are kept as ``OrtValue`` between steps so bfloat16
state never passes through numpy; the caller-read outputs (logits) get a
float32 Cast appended (in a copy of the graph) when they are not float32,
because onnxruntime cannot hand bfloat16 to numpy.

bf16 packages: onnxruntime's CPU provider has no bfloat16 kernels, so by default
a package whose manifest says ``dtype: bf16`` is loaded through
:func:`mobius_testing.bf16_emulation.emulate_bf16` (float32 graph, rounded to
bf16 after every op that stores bf16; fusions off). Inputs, state and outputs
are then float32 holding bf16 values; ``runner.bf16_emulated`` says so. On a
CUDA provider the same package would run natively; this runner is CPU-only.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8,
}
F32_SUFFIX = "__mobius_test_f32"


def _ort_value(array: np.ndarray, ort_type: str):
    """An OrtValue of ``array`` converted to the session's ``ort_type``."""
    import onnxruntime as ort
    from onnx import TensorProto

    if ort_type == "tensor(bfloat16)":
        import ml_dtypes

        bits = np.ascontiguousarray(array.astype(ml_dtypes.bfloat16)).view(np.uint16)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            bits, onnx_element_type=TensorProto.BFLOAT16
        )
    if ort_type not in ORT_TYPES:
        raise TypeError(f"ort_loop cannot feed {ort_type}")
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array.astype(ORT_TYPES[ort_type])))


def _with_f32_outputs(path: Path, names: Sequence[str]) -> Path:
    """A sibling copy of the graph at ``path`` with ``name + F32_SUFFIX`` float32 outputs."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    outs = {o.name: o for o in model.graph.output}
    for name in names:
        cast_name = name + F32_SUFFIX
        model.graph.node.append(
            onnx.helper.make_node("Cast", [name], [cast_name], to=onnx.TensorProto.FLOAT)
        )
        dims = [d.dim_param or d.dim_value for d in outs[name].type.tensor_type.shape.dim]
        model.graph.output.append(
            onnx.helper.make_tensor_value_info(cast_name, onnx.TensorProto.FLOAT, dims)
        )
    copy = path.with_name(path.stem + ".f32out.onnx")
    onnx.save(model, str(copy))  # external data stays where the original points
    return copy


@dataclass
class _Session:
    name: str
    session: object
    inputs: dict[str, str]  # port -> ort type
    outputs: list[str]
    f32_copies: set[str] = field(default_factory=set)  # ports read via a Cast copy


class ContractRunner:
    """Runs one package's contract on onnxruntime CPU (bf16 packages: emulated, see module doc).

    ``step(input_ids)`` runs one prefill or decode step (``input_ids [B, S]``) and
    returns the caller-read outputs (``contract.outputs``, e.g. ``decoder.logits``)
    as float32 numpy arrays keyed by ``component.port``.
    """

    def __init__(
        self, package: Path, *, threads: int = 1, emulate_bf16: bool | None = None
    ) -> None:
        """Open every text component; ``emulate_bf16`` None = when the package is bf16."""
        import onnxruntime as ort

        from mobius.contract import Contract

        self.root = Path(package)
        self.manifest = json.loads((self.root / "mobius.json").read_text())
        self.contract = Contract.from_dict(self.manifest["contract"])
        if emulate_bf16 is None:
            emulate_bf16 = self.manifest.get("dtype") == "bf16"
        self.bf16_emulated = False
        self._scratch: tempfile.TemporaryDirectory | None = None
        readers: dict[str, list[str]] = {}
        for full in self.contract.outputs:
            comp, port = full.split(".", 1)
            readers.setdefault(comp, []).append(port)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self.sessions: dict[str, _Session] = {}
        for comp in self._order():
            path = self.root / self.manifest["components"][comp]["path"]
            comp_opts = opts
            if emulate_bf16:
                emulated = self._emulated(comp, path)
                if emulated is not None:
                    path, comp_opts = emulated, self._emulation_options(threads)
            probe = ort.InferenceSession(str(path), comp_opts, providers=["CPUExecutionProvider"])
            out_types = {o.name: o.type for o in probe.get_outputs()}
            need_cast = [p for p in readers.get(comp, []) if out_types.get(p) != "tensor(float)"]
            need_cast = [p for p in need_cast if out_types.get(p, "").startswith("tensor(")]
            sess = probe
            if need_cast:
                sess = ort.InferenceSession(
                    str(_with_f32_outputs(path, need_cast)),
                    comp_opts,
                    providers=["CPUExecutionProvider"],
                )
            self.sessions[comp] = _Session(
                comp,
                sess,
                {i.name: i.type for i in sess.get_inputs()},
                [o.name for o in sess.get_outputs()],
                set(need_cast),
            )
        self._check_sources()
        self.state: dict[str, object] = {}
        self.past = 0

    def _emulated(self, comp: str, path: Path) -> Path | None:
        """A float32 bf16-emulating copy of the graph at ``path`` (None: it has no bf16).

        Written to a scratch folder owned by the runner, never into the package.
        """
        import onnx_ir as ir

        from mobius_testing.bf16_emulation import emulate_bf16, has_bf16

        model = ir.load(str(path))
        if not has_bf16(model):
            return None
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="mobius-bf16emu-")
        out = Path(self._scratch.name) / comp / path.name
        out.parent.mkdir(parents=True, exist_ok=True)
        ir.save(emulate_bf16(model), str(out), external_data=out.name + ".data")
        self.bf16_emulated = True
        return out

    @staticmethod
    def _emulation_options(threads: int):
        from mobius_testing.bf16_emulation import emulation_session_options

        return emulation_session_options(threads)

    def _order(self) -> list[str]:
        """Text-only components in dependency order (producers of same-step edges first).

        Components with a presence key (``image``, ``audio``) never run here: the
        tests feed text only, so their consumers get the optional zero fallback.
        """
        names = [c.name for c in self.contract.components if c.presence is None]
        deps = {n: set() for n in names}
        for e in self.contract.edges:
            consumer, producer = e.consumer.split(".", 1)[0], e.producer.split(".", 1)[0]
            if consumer in deps and producer in deps:
                deps[consumer].add(producer)
        order: list[str] = []
        while len(order) < len(names):
            ready = [n for n in names if n not in order and deps[n] <= set(order)]
            if not ready:
                raise ValueError(f"contract edges form a cycle among {names}")
            order.extend(ready)
        return order

    def _check_sources(self) -> None:
        """Every session input of every component has exactly one contract source."""
        sources: dict[str, list[str]] = {}
        for e in self.contract.edges:
            if e.producer.split(".", 1)[0] in self.sessions:
                sources.setdefault(e.consumer, []).append("edge")
            elif e.consumer in {o.consumer for o in self.contract.optionals}:
                sources.setdefault(e.consumer, []).append("optional")
        for s in self.contract.states:
            sources.setdefault(s.consumer, []).append("state")
        for x in self.contract.externals:
            sources.setdefault(x.consumer, []).append(x.kind)
        problems = []
        for comp, sess in self.sessions.items():
            for port in sess.inputs:
                got = sources.get(f"{comp}.{port}", [])
                if len(got) != 1:
                    problems.append(f"{comp}.{port}: {len(got)} sources {got}")
        if problems:
            raise ValueError("contract does not feed the graphs: " + "; ".join(problems))

    def reset(self) -> None:
        """Forget the KV state: the next step is a prefill."""
        self.state = {}
        self.past = 0

    def step(self, input_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Run one step over ``input_ids [B, S]``; return the caller-read outputs as f32."""
        ids = np.asarray(input_ids, dtype=np.int64)
        batch, seq = ids.shape
        past = self.past
        produced: dict[str, object] = {}
        edges = {e.consumer: e.producer for e in self.contract.edges}
        states = {s.consumer: s for s in self.contract.states}
        externals = {x.consumer: x for x in self.contract.externals}  # "component.port"
        optionals = {o.consumer: o for o in self.contract.optionals}
        for comp, sess in self.sessions.items():
            feeds = {}
            for port, ort_type in sess.inputs.items():
                key = f"{comp}.{port}"
                if key in edges and edges[key] in produced:
                    feeds[port] = produced[edges[key]]
                elif key in optionals and key not in externals:
                    zeros = np.zeros(optionals[key].absent_shape, np.float32)
                    feeds[port] = _ort_value(zeros, ort_type)
                elif key in states:
                    if key in self.state:
                        feeds[port] = self.state[key]
                    else:
                        shape = [
                            batch if d == "batch" else (d if isinstance(d, int) else 0)
                            for d in states[key].initial_shape
                        ]
                        feeds[port] = _ort_value(np.zeros(shape, np.float32), ort_type)
                elif key in externals and externals[key].kind == "generated":
                    if externals[key].name == "attention_mask":
                        arr = np.ones((batch, past + seq), np.int64)
                    elif externals[key].name == "position_ids":
                        arr = np.broadcast_to(np.arange(past, past + seq), (batch, seq))
                    else:
                        raise ValueError(f"unknown generated input {key}")
                    feeds[port] = _ort_value(arr, ort_type)
                elif key in externals:
                    if externals[key].name == "input_ids":
                        feeds[port] = _ort_value(ids, ort_type)
                    elif key in optionals:
                        feeds[port] = _ort_value(
                            np.zeros(optionals[key].absent_shape, np.float32), ort_type
                        )
                    else:
                        raise ValueError(f"the test supplies no caller input {key}")
                else:
                    raise ValueError(f"no source for {key}")
            names = sess.outputs
            values = sess.session.run_with_ort_values(names, feeds)
            for name, value in zip(names, values):
                produced[f"{comp}.{name}"] = value
        self.state = {s.consumer: produced[s.producer] for s in self.contract.states}
        self.past = past + seq
        result = {}
        for full in self.contract.outputs:
            comp, port = full.split(".", 1)
            src = full + F32_SUFFIX if port in self.sessions[comp].f32_copies else full
            result[full] = produced[src].numpy().astype(np.float32)
        return result

    def run(self, ids: np.ndarray, prefill: int, output: str | None = None) -> np.ndarray:
        """Prefill ``ids[:, :prefill]`` then decode the rest one token a step.

        Returns ``output`` (default: the first contract output) concatenated over
        the sequence axis: ``[B, T, V]`` float32, comparable to a no-cache forward.
        """
        self.reset()
        key = output or self.contract.outputs[0]
        chunks = [self.step(ids[:, :prefill])[key]]
        for s in range(prefill, ids.shape[1]):
            chunks.append(self.step(ids[:, s : s + 1])[key])
        return np.concatenate(chunks, axis=1)
