"""One onnxruntime session per component, checked against the contract.

Sessions use full graph optimization, sequential execution and a fixed number
of intra-op threads. Before a session is used, its declared inputs and outputs
are compared with the component's contract ports (name, dtype, rank): a package
whose graphs drifted from its manifest fails here, naming component and port,
instead of failing later inside onnxruntime with a cryptic message. Likewise a
bf16 package opened on CPU (onnxruntime has no CPU bfloat16 kernels) raises a
DeviceError that says to use CUDA or rebuild as f32 / f16.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mobius.errors import ContractError, PackageError
from mobius_runtime.device import providers_for
from mobius_runtime.errors import DeviceError, RequestError
from mobius_runtime.feeds import PORT_TO_ORT

MAX_THREADS_PER_CORE = 4
"""``threads`` above this many per CPU core is refused: onnxruntime would start them all."""


def check_threads(threads: int | None) -> None:
    """Refuse a thread count onnxruntime cannot use (negative, or absurdly many)."""
    if threads is None or threads == 0:
        return
    cores = os.cpu_count() or 1
    limit = cores * MAX_THREADS_PER_CORE
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= limit:
        raise RequestError(  # one range in both parts (they used to say 1..4x and 1..1x cores)
            f"threads={threads!r} is out of range: the limit is 1 to {limit} "
            f"({MAX_THREADS_PER_CORE} per CPU core; this machine has {cores})",
            where="threads (--threads)",
            fix=f"pass a number from 1 to {limit} ({cores}, one per core, is usually the "
            "fastest: more threads than cores slow onnxruntime down), or leave it unset for "
            "onnxruntime's default",
        )


SMALL_MODEL_BYTES = 4 * 2**20
"""A package whose components' files total less than this runs one intra-op thread when
``threads`` is unset (:func:`decide_threads`)."""


def package_bytes(paths: Iterable[Path]) -> int:
    """Bytes of the files beside each component graph in ``paths`` (graph + weights)."""
    total = 0
    for path in paths:
        for entry in Path(path).parent.iterdir():
            if entry.is_file():
                total += entry.stat().st_size
    return total


def decide_threads(threads: int | None, device: str, weight_bytes: int) -> tuple[int | None, str]:
    """The intra-op thread count a pipeline opens its sessions with, and why (for the log).

    A count the caller gave is kept. Unset, on CPU, a package under
    :data:`SMALL_MODEL_BYTES` gets one thread and any other onnxruntime's default (one
    per physical core, pinned). Measured (2026-12-03, onnxruntime 1.31.1, 2-core AMD EPYC
    VM, random Gemma 4 text packages ``--target cpu``, 64 greedy tokens, medians of 5
    interleaved generations, spinning on): 1.9 MB (testdata/tiny-gemma4) 2000 tok/s on
    one thread against 1914 on two (a step is ~400 us of ~300 small nodes, and waking
    the second thread for each parallel one costs more than it saves); 9 MB 1239 vs
    1271 (even); 35 MB 331 vs 418; 157 MB 90 vs 131; SmolLM2-135M (109 MB) 79 vs 111.
    """
    if threads:
        return threads, "given"
    if device != "cpu":
        return None, f"onnxruntime's default (device {device})"
    if weight_bytes < SMALL_MODEL_BYTES:
        return 1, f"1 (a {weight_bytes / 2**20:.1f} MiB package runs faster on one thread)"
    return None, "onnxruntime's default (one per physical core)"


SPIN_MODES = ("auto", "on", "off")
"""``spin`` values of :func:`decide_spin` (``Pipeline.load(spin=...)``, ``--spin``)."""

SPIN_BUSY_LIMIT = 0.25
"""``auto`` spins only while other work uses at most this many cores of the ones the
session's threads need."""


def _busy_cores(window_s: float = 0.05) -> float | None:
    """Cores busy with work other than this process' main thread over a short sleep:
    two reads of ``/proc/stat`` ``window_s`` apart (None where there is no /proc/stat)."""
    import time

    def read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        if len(fields) < 5:
            return None
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    first = read()
    time.sleep(window_s)
    second = read()
    if first is None or second is None or second[1] <= first[1]:
        return None
    cores = os.cpu_count() or 1
    return cores * (second[0] - first[0]) / (second[1] - first[1])


def decide_spin(mode: str, threads: int | None, device: str = "cpu") -> tuple[bool, str]:
    """Whether onnxruntime's intra-op workers spin inside a run, and why (for the log).

    Measured (2026-12-02, onnxruntime 1.31.1, 2 threads on a 2-core AMD EPYC VM, real
    SmolLM2-135M / Gemma 3 270M GGUF builds ``--target cpu``, 64 greedy tokens, medians
    of 4 turns in one process): with the machine otherwise idle, spinning inside a run
    raised decode from 34.3 to 40.8 tok/s (SmolLM2) and 25.1 to 28.1–29.4 (Gemma 3): a
    decode step is ~1000 small nodes, and a worker that blocks between them is woken
    by the kernel for each parallel one. With the cores taken by other jobs (load
    average 5.3) it fell from 16.6 to 8.9 (13.1 when spinning stops as each run
    returns): a spinning worker takes the time slice the runnable jobs need (as
    measured earlier on tiny Gemma 4 at load average 5.8: no spinning 1.03x
    onnxruntime-genai's decode, spinning 0.45x). So:
    ``on`` spins, ``off`` never does, ``auto`` (the default) spins only when the cores
    the threads need are free now (other work on at most :data:`SPIN_BUSY_LIMIT` of
    them, read from ``/proc/stat`` over 50 ms), and never on CUDA (the GPU does the
    work). Spinning workers always stop when a run returns
    (``session.force_spinning_stop``): nothing spins between tokens or requests. The
    choice is made once, when the pipeline loads; on a machine that gets busy later,
    pass ``off``.
    """
    if mode not in SPIN_MODES:
        raise RequestError(
            f"spin={mode!r} is not one of {', '.join(SPIN_MODES)}",
            where="spin (--spin)",
            fix="pass auto (spin while the cores are free), on or off",
        )
    if mode != "auto":
        return mode == "on", mode
    if device != "cpu":
        return False, f"auto: device {device}"
    cores = os.cpu_count() or 1
    need = min(int(threads) if threads else cores, cores)
    busy = _busy_cores()
    if busy is None:
        return False, "auto: no /proc/stat to tell whether the cores are free"
    free = cores - busy
    spin = free >= need - SPIN_BUSY_LIMIT
    return spin, f"auto: {busy:.2f} of {cores} cores busy, {need} needed"


def session_options(threads: int | None, spin: bool = False) -> Any:
    """Tuned options: ORT_ENABLE_ALL, sequential execution, ``threads`` intra-op threads,
    and intra-op spinning as :func:`decide_spin` chose (always stopped when a run returns).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    if threads:
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
    return options


def open_session(path: Path, device: str, threads: int | None, spin: bool = False) -> Any:
    """An InferenceSession for the graph at ``path`` on the resolved ``device``."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(
            str(path), sess_options=session_options(threads, spin), providers=providers_for(device)
        )
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        problem = quant_kernel_problem(path, device) if _missing_kernel(exc) else None
        if problem is not None:
            raise DeviceError(
                f"{path.parent.name}/{path.name}: {problem}",
                where=str(path),
                fix="rebuild with `mobius build --quant ... --dtype f32` (or f16) for CPU; "
                "bf16 quantized packages need --device cuda",
            ) from exc
        if device == "cpu" and _missing_kernel(exc) and computes_bf16(path):
            raise DeviceError(
                f"{path.parent.name}/{path.name} computes in bfloat16 (a `--dtype bf16` build), "
                "and onnxruntime's CPU provider has no bfloat16 kernels "
                f"({str(exc).strip()[:200]})",
                where=str(path),
                fix="bf16 packages need CUDA: run with --device cuda on a machine with a GPU and "
                "onnxruntime-gpu; for CPU, rebuild with `mobius build --dtype f32` (or f16)",
            ) from exc
        raise PackageError(
            f"onnxruntime cannot load {path.parent.name}/{path.name}: {str(exc).strip()}",
            where=str(path),
            fix="rebuild the package with `mobius build`; if it persists, report it with this "
            "message (the graph is not loadable by this onnxruntime)",
        ) from exc


QUANT_KERNELS: dict[str, dict[str, frozenset[str]]] = {
    op: {
        "cpu": frozenset({"float32", "float16"}),
        "cuda": frozenset({"float32", "float16", "bfloat16"}),
    }
    for op in ("MatMulNBits", "GatherBlockQuantized")
}
"""com.microsoft weight-only quantized ops: activation dtypes with a kernel per device.
CPU measured on onnxruntime 1.31 (bfloat16: NOT_IMPLEMENTED at session creation);
CUDA from onnxruntime's kernel registrations (docs/quantization.md)."""

_EP_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def load_with_weights(path: Path) -> Any:
    """The ``onnx.ModelProto`` at ``path`` with its external data read in (a package
    already checked: every reference lies inside a pinned file).

    Not ``onnx.load(path)``: onnx (and onnx_ir) refuse external data with more than one
    hard link, and a package's ``shared.data`` (docs/internals.md) has one per component
    reading it; onnxruntime reads it as any file.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graphs, tensors = [model.graph], []
    while graphs:
        graph = graphs.pop()
        tensors.extend(graph.initializer)
        for node in graph.node:
            for attr in node.attribute:
                tensors.extend([attr.t] if attr.HasField("t") else attr.tensors)
                graphs.extend([attr.g] if attr.HasField("g") else attr.graphs)
    for tensor in tensors:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        with open(path.parent / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0)))
            tensor.raw_data = f.read(int(info["length"])) if "length" in info else f.read()
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    return model


def quant_kernel_problem(path: Path, device: str) -> str | None:
    """Why the quantized ops of the graph at ``path`` have no kernel on ``device``, or None.

    The activation dtype of each op is its ``scales`` input's type (input 2). Reads the
    graph only (external data stays on disk); never raises.
    """
    try:
        import onnx

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:
        return None
    types = {t.name: t.data_type for t in graph.initializer}
    missing: dict[tuple[str, str], int] = {}
    for node in graph.node:
        table = QUANT_KERNELS.get(node.op_type) if node.domain == "com.microsoft" else None
        if table is None or len(node.input) < 3 or node.input[2] not in types:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(types[node.input[2]]).name
        dtype = "bfloat16" if types[node.input[2]] == onnx.TensorProto.BFLOAT16 else dtype
        if dtype not in table.get(device, frozenset()):
            key = (node.op_type, dtype)
            missing[key] = missing.get(key, 0) + 1
    if not missing:
        return None
    ep = _EP_NAMES.get(device, device)
    listed = ", ".join(f"{op} with {dt} activations ({n} nodes)" for (op, dt), n in missing.items())
    return f"onnxruntime's {ep} has no kernel for com.microsoft {listed}"


def _missing_kernel(exc: Exception) -> bool:
    text = str(exc)
    return "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text


def computes_bf16(path: Path) -> bool:
    """True when the graph at ``path`` has bfloat16 inputs, outputs, values or weights.

    Reads the graph only (external weight data stays on disk); used to explain
    a CPU session failure, so it never raises.
    """
    try:
        import onnx

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:
        return False
    bf16 = onnx.TensorProto.BFLOAT16
    typed = [*graph.input, *graph.output, *graph.value_info]
    return any(v.type.tensor_type.elem_type == bf16 for v in typed) or any(
        t.data_type == bf16 for t in graph.initializer
    )


def check_ports(session: Any, component: Any) -> None:
    """Raise :class:`ContractError` listing every port that differs from the contract."""
    problems: list[str] = []
    _compare(problems, component.name, "input", component.inputs, session.get_inputs(), strict=True)
    _compare(
        problems, component.name, "output", component.outputs, session.get_outputs(), strict=False
    )
    if problems:
        raise ContractError(
            f"component {component.name!r}: its graph does not match the contract in "
            "mobius.json:\n  " + "\n  ".join(problems),
            where=f"component {component.name}",
            fix="rebuild the package with `mobius build`; the graph and manifest disagree",
        )


def _compare(
    problems: list[str], comp: str, kind: str, ports: Any, args: Any, *, strict: bool
) -> None:
    declared = {a.name: a for a in args}
    for port in ports:
        arg = declared.pop(port.name, None)
        if arg is None:
            problems.append(f"{kind} port {comp}.{port.name} is missing from the graph")
            continue
        want = PORT_TO_ORT.get(port.dtype, port.dtype)
        if arg.type != want:
            problems.append(
                f"{kind} port {comp}.{port.name}: contract says {port.dtype}, graph has {arg.type}"
            )
        shape = arg.shape
        if isinstance(shape, list) and len(shape) != len(port.shape):
            problems.append(
                f"{kind} port {comp}.{port.name}: contract rank {len(port.shape)} "
                f"{list(port.shape)}, graph rank {len(shape)} {shape}"
            )
    if strict:
        for name in declared:
            problems.append(f"{kind} {comp}.{name} exists in the graph but not in the contract")
