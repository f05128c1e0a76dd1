"""What 4-bit forms of a package's int8 + zero-point MatMulNBits weights would cost per
decode step (timing only: the variants' weights are random, their outputs meaningless).

A ``--target cpu`` GGUF build stores Q4_1 / Q4_K tensors as int8 blocks with uint8 zero
points (9.25 bits a value). Two 4-bit forms of the same graph, each weight replaced in
place (same N, K, block 32, accuracy level):

- ``exact``: symmetric int4 levels plus a per-block correction, what an exact form of the
  file's ``d·q + m`` blocks needs: ``MatMulNBits(x) + ReduceSum(x by blocks of 32) @ C``
  (one Reshape + ReduceSum per distinct input, one ``[K/32, N]`` float32 MatMul + Add per
  weight);
- ``int4zp``: int4 with uint8 zero points (5.12 bits a value: an approximation of the
  file's values, a shift of up to half a step per block).

``python benchmarks/nbits_variants.py PACKAGE [--steps 80]``: the package's own graph and
the two variants, one decode step each in turn (the 129th position after a 128-id
prefill), the same inputs; prints the median wall time and the median CPU time of the
process per step (all threads: on a shared machine the CPU time is the steadier
measure of the work), the ratios to the package's graph, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def variant(src: Path, mode: str, dst: Path) -> None:
    """Write ``dst/model.onnx`` (external data beside it): ``src``'s graph with each int8 +
    zero-point MatMulNBits replaced by its ``mode`` form (random weights)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph, rng = model.graph, np.random.default_rng(0)
    nodes, sums, dropped = [], {}, set()

    def add(array: np.ndarray, name: str) -> str:
        graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    for node in graph.node:
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        if node.op_type != "MatMulNBits" or len(node.input) < 4 or a["bits"] != 8:
            nodes.append(node)
            continue
        n, k, base = a["N"], a["K"], node.name
        nb = -(-k // a["block_size"])
        dropped.update(node.input[1:])
        inputs = [
            node.input[0],
            add(rng.integers(0, 256, (n, nb, a["block_size"] // 2), dtype=np.uint8), base + ".q4"),
            add((rng.random((n, nb)) * 0.01).astype(np.float32), base + ".s4"),
        ]
        if mode == "int4zp":
            zp = rng.integers(0, 256, n * ((nb + 1) // 2), dtype=np.uint8)
            inputs.append(add(zp, base + ".z4"))
        out = node.output[0] if mode == "int4zp" else base + ".levels"
        attrs = dict(a, bits=4)
        nodes.append(
            helper.make_node(
                "MatMulNBits", inputs, [out], name=base + ".4", domain="com.microsoft", **attrs
            )
        )
        if mode == "exact":
            x = node.input[0]
            if x not in sums:
                shape = add(np.array([0, 0, nb, a["block_size"]], np.int64), base + ".blocks")
                axes = add(np.array([-1], np.int64), base + ".axes")
                nodes.append(helper.make_node("Reshape", [x, shape], [base + ".xb"]))
                nodes.append(
                    helper.make_node("ReduceSum", [base + ".xb", axes], [base + ".xs"], keepdims=0)
                )
                sums[x] = base + ".xs"
            c = add((rng.standard_normal((nb, n)) * 0.01).astype(np.float32), base + ".c")
            nodes.append(helper.make_node("MatMul", [sums[x], c], [base + ".cx"]))
            nodes.append(helper.make_node("Add", [out, base + ".cx"], [node.output[0]]))
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    dst.mkdir(parents=True, exist_ok=True)
    onnx.save(
        model, str(dst / "model.onnx"), save_as_external_data=True, location="model.onnx.data"
    )


def decode_feeds(session) -> dict[str, np.ndarray]:
    """The inputs of the 129th position's step, after a 128-id prefill of this session."""
    inputs = session.get_inputs()
    kv = [i for i in inputs if i.name.startswith("past_key_values.")]
    feeds = {
        "input_ids": np.arange(10, 138, dtype=np.int64)[None],
        "attention_mask": np.ones((1, 128), np.int64),
        "position_ids": np.arange(128, dtype=np.int64)[None],
        **{i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in kv},
    }
    outs = [o.name for o in session.get_outputs()]
    values = dict(zip(outs, session.run(None, feeds)))
    return {
        "input_ids": np.array([[5]], np.int64),
        "attention_mask": np.ones((1, 129), np.int64),
        "position_ids": np.array([[128]], np.int64),
        **{i.name: values[i.name.replace("past_key_values.", "present.")] for i in kv},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package", type=Path)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import onnxruntime as ort

    source = args.package / "model" / "model.onnx"
    work = Path(tempfile.mkdtemp(prefix="mobius-nbits-"))
    paths = {"package": source}
    for mode in ("exact", "int4zp"):
        variant(source, mode, work / mode)
        paths[mode] = work / mode / "model.onnx"
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    sessions = {
        k: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
        for k, p in paths.items()
    }
    feeds = {k: decode_feeds(s) for k, s in sessions.items()}
    names = list(sessions)
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    before = os.getloadavg()
    for step in range(args.steps):
        for i in range(len(names)):
            name = names[(step + i) % len(names)]
            w, c = time.perf_counter(), time.process_time()
            sessions[name].run(["logits"], feeds[name])
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    after = os.getloadavg()
    base_w, base_c = statistics.median(wall["package"]), statistics.median(cpu["package"])
    for name in names:
        mw, mc = statistics.median(wall[name]), statistics.median(cpu[name])
        print(
            f"{name:8s}: decode step wall {mw * 1e3:7.2f} ms ({mw / base_w:.3f}x), "
            f"CPU {mc * 1e3:7.2f} ms ({mc / base_c:.3f}x)"
        )
    print(
        f"load average before {before[0]:.2f} / {before[1]:.2f}, after {after[0]:.2f} / "
        f"{after[1]:.2f} (1 / 5 min) on {os.cpu_count()} cores"
    )
    for mode in ("exact", "int4zp"):
        for f in (work / mode).iterdir():
            f.unlink()
        (work / mode).rmdir()
    work.rmdir()


if __name__ == "__main__":
    main()
