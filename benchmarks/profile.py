"""Where a package's CPU time goes: onnxruntime's per-op profile of a real generation,
and the cost of each MatMulNBits weight form alone.

``python benchmarks/profile.py PACKAGE [PACKAGE ...]``: each package generates
``--new`` greedy tokens after a ``--prompt-len`` prompt through ``Pipeline`` (2 threads,
the runtime's own session options plus ``enable_profiling``); prints, for the prefill and
per decode step, each op type's kernel time (total, share, nodes per step), the
costliest nodes, the gap between ``model_run`` and the kernels' sum (onnxruntime's
per-node dispatch), and the MatMulNBits forms the graph holds (bits, block size, zero
points, nodes, weight bytes read per token).

``python benchmarks/profile.py --forms N K [--count M]``: M distinct ``[N, K]``
MatMulNBits weights (M of them so that a step reads memory, not cache, as a model's
decode does), one ``[1, 1, K]`` row through all of them, in each form a GGUF build can
emit; the median time per weight and the bytes it reads.

No assertions; the load average is printed (the machine is shared: compare figures of
one run only).
"""

from __future__ import annotations

import argparse
import collections
import gc
import glob
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min) on {os.cpu_count()} cores"


def nbits_forms(package: Path) -> list[str]:
    """One line per MatMulNBits form of the package's graphs: count and bytes per token."""
    import onnx

    forms: collections.Counter = collections.Counter()
    sizes: collections.Counter = collections.Counter()
    for path in sorted(package.glob("*/*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        types = {t.name: t.data_type for t in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type != "MatMulNBits":
                continue
            a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
            zp = "none"
            if len(node.input) > 3 and node.input[3]:
                uint8 = types.get(node.input[3]) == onnx.TensorProto.UINT8
                zp = "uint8" if uint8 else "float"
            key = (a["bits"], a["block_size"], a.get("accuracy_level", 0), zp)
            forms[key] += 1
            n, k = a["N"], a["K"]
            blocks = -(-k // a["block_size"])
            sizes[key] += n * blocks * (a["block_size"] * a["bits"] // 8 + 4)
    return [
        f"  MatMulNBits int{b} block {bs} accuracy {acc} zero points {zp}: {forms[b, bs, acc, zp]}"
        f" nodes, {sizes[b, bs, acc, zp] / 2**20:.1f} MiB of blocks + float32 scales"
        for b, bs, acc, zp in sorted(forms)
    ]


def profile(package: Path, prompt_len: int, new: int, threads: int) -> None:
    from mobius_runtime import Pipeline, ort_sessions

    prefix = Path(tempfile.mkdtemp(prefix="mobius-profile-")) / "run"
    real = ort_sessions.session_options

    def with_profiling(n, spin=False):
        options = real(n, spin)
        options.enable_profiling = True
        options.profile_file_prefix = str(prefix)
        return options

    ort_sessions.session_options = with_profiling
    try:
        pipe = Pipeline.load(package, device="cpu", threads=threads)
    finally:
        ort_sessions.session_options = real
    ids = [2, *np.random.default_rng(0).integers(10, 300, prompt_len - 1).tolist()]
    result = pipe.generate(input_ids=ids, max_new_tokens=new, stop_ids=())
    del pipe
    gc.collect()  # the sessions write their profiles when they close
    files = sorted(glob.glob(f"{prefix}*.json"), key=os.path.getmtime)
    events = [e for f in files for e in json.loads(Path(f).read_text())]
    for f in files:
        os.remove(f)
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    if len(runs) < 2:
        raise SystemExit(f"{package}: no decode step was profiled")
    print(f"{package}: prompt {prompt_len} ids, {len(result.ids)} tokens, {threads} threads")
    prefill_end = runs[0]["ts"] + runs[0]["dur"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    for label, steps, pick in (
        ("prefill", 1, lambda e: e["ts"] <= prefill_end),
        ("decode step", len(runs) - 1, lambda e: e["ts"] > prefill_end),
    ):
        by_op: collections.Counter = collections.Counter()
        count: collections.Counter = collections.Counter()
        by_node: collections.Counter = collections.Counter()
        for e in nodes:
            if pick(e):
                op = e["args"].get("op_name", "?")
                by_op[op] += e["dur"]
                count[op] += 1
                by_node[e["name"].removesuffix("_kernel_time")] += e["dur"]
        kernels = sum(by_op.values()) / steps / 1000
        wall = [e["dur"] / 1000 for e in (runs[:1] if steps == 1 else runs[1:])]
        print(
            f"  {label}: model_run {statistics.median(wall):.2f} ms (median), kernels "
            f"{kernels:.2f} ms, the rest (dispatch between nodes) "
            f"{statistics.median(wall) - kernels:.2f} ms"
        )
        for op, us in by_op.most_common(10):
            share = 100 * us / steps / 1000 / kernels
            print(
                f"    {op:26s} {us / steps / 1000:8.3f} ms {share:5.1f}%  {count[op] // steps} nodes"
            )
        for name, us in by_node.most_common(3):
            print(f"      node {name[:64]:64s} {us / steps / 1000:.3f} ms")
    for line in nbits_forms(package):
        print(line)


FORMS = (  # (bits, block size, zero points) a GGUF build emits, and the ones it could
    (8, 32, "none"),  # Q8_0, Q5_0
    (8, 32, "uint8"),  # Q4_1 / Q4_K under --target cpu (int8 approximation)
    (8, 16, "none"),  # Q6_K
    (4, 32, "none"),  # Q4_0
    (4, 32, "uint8"),  # an int4 approximation of Q4_1 / Q4_K (not built)
    (4, 32, "float"),  # Q4_1 / Q4_K exact (--target default)
)


def forms(n: int, k: int, count: int, threads: int, runs: int) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    print(f"MatMulNBits [{n}, {k}] x {count} distinct weights, one row, {threads} threads")
    for bits, block, zp in FORMS:
        nb = k // block
        inits, nodes, outs, nbytes = [], [], [], 0
        for i in range(count):
            q = rng.integers(0, 2**bits, (n, nb, block), dtype=np.uint8)
            if bits == 4:
                q = (q[..., ::2] | (q[..., 1::2] << 4)).astype(np.uint8)
            scales = (rng.random(n * nb) * 0.01).astype(np.float32)
            tensors = [
                numpy_helper.from_array(q, f"q{i}"),
                numpy_helper.from_array(scales, f"s{i}"),
            ]
            if zp == "uint8":
                z = rng.integers(0, 2**bits, (n, nb), dtype=np.uint8)
                if bits == 4:
                    z = np.pad(z, ((0, 0), (0, nb % 2)))
                    z = (z[:, ::2] | (z[:, 1::2] << 4)).astype(np.uint8)
                tensors.append(numpy_helper.from_array(z.reshape(-1), f"z{i}"))
            elif zp == "float":
                z = (rng.random(n * nb) * (2**bits - 1)).astype(np.float32)
                tensors.append(numpy_helper.from_array(z, f"z{i}"))
            nbytes += sum(t.raw_data.__len__() for t in tensors)
            inits += tensors
            attrs = {"K": k, "N": n, "bits": bits, "block_size": block, "accuracy_level": 4}
            inputs = ["x"] + [t.name for t in tensors]
            nodes.append(
                helper.make_node("MatMulNBits", inputs, [f"y{i}"], domain="com.microsoft", **attrs)
            )
            outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
        graph = helper.make_graph(
            nodes,
            "forms",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])],
            outs,
            inits,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)],
            ir_version=11,
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        sess.run(None, {"x": x})
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            sess.run(None, {"x": x})
            times.append(time.perf_counter() - start)
        per = statistics.median(times) / count * 1e6
        mib = nbytes / count / 2**20
        print(
            f"  int{bits} block {block:2d} zero points {zp:5s}: {per:8.0f} us per weight, "
            f"{mib:.2f} MiB each ({8 * nbytes / count / (n * k):.2f} bits per value)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packages", nargs="*", type=Path)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--forms", nargs=2, type=int, metavar=("N", "K"))
    ap.add_argument("--count", type=int, default=60, help="distinct weights for --forms")
    ap.add_argument("--runs", type=int, default=15, help="timed runs for --forms")
    args = ap.parse_args()
    if args.forms:
        forms(*args.forms, args.count, args.threads, args.runs)
    for package in args.packages:
        profile(package, args.prompt_len, args.new, args.threads)
    print(_load_line())


if __name__ == "__main__":
    main()
