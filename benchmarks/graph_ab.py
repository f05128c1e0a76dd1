"""Two builds of one model (e.g. main's package and a branch's) compared step for step:
decode step time, nodes run per step, logits and greedy ids.

Both packages' ``model/model.onnx`` are opened with raw onnxruntime CPU sessions under the
same options (ORT_ENABLE_ALL, sequential, ``--threads`` intra-op threads, spinning per
``--spin``), so only the graphs differ. Printed:

- nodes run per decode step, by op type, for each (one profiled step of a separate
  session: what onnxruntime executes after its own graph optimizations);
- the greedy ids of ``--new`` tokens after a ``--prompt-len``-id prefill (ids of a fixed
  English text, from the package's ``tokenizer.json``), each package fed its own ids, and
  the largest ``|Δ logits|`` of each step while the ids agree (where they part, the index
  and the top-2 margin of the first package there);
- one decode step (the 129th position after a 128-id prefill, the same inputs for both)
  timed ``--steps`` times per package, alternating which goes first: median wall time and
  median process CPU time (all threads) per step, the ratio new / old, and the load
  average before and after.

``--accuracy-level N`` first rewrites every MatMulNBits of both graphs (temporary copies)
to ``accuracy_level = N``; ``0`` computes them with float activations instead of the int8
activations of ``4`` (what ``--target cpu`` packages use), which tells a graph change's own
rounding apart from the int8 rounding it sets off downstream.

``--noise-floor`` prints, instead of all the above, the largest ``|Δ logits|`` of the
prefill's last row between old and new as packaged, each against its own copy at
accuracy level 0, and old vs new at level 0: how far the int8 activations alone move a
package's logits, next to how far the graph change moves them.

Usage: python benchmarks/graph_ab.py OLD_PACKAGE NEW_PACKAGE [--steps 200] [--threads 2]
           [--spin off|on] [--new 32] [--prompt-len 128] [--accuracy-level N] [--noise-floor]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp import TEXT
from nbits_variants import decode_feeds


def options(threads: int, spin: str, profile: str | None = None):
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    o.log_severity_level = 3
    o.intra_op_num_threads, o.inter_op_num_threads = threads, 1
    o.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin == "on" else "0")
    if profile:
        o.enable_profiling, o.profile_file_prefix = True, profile
    return o


def session(package: Path, opts):
    import onnxruntime as ort

    path = str(package / "model" / "model.onnx")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def nodes_per_step(package: Path, threads: int) -> collections.Counter:
    """Op types of the nodes one decode step runs (onnxruntime's profile of that step)."""
    with tempfile.TemporaryDirectory(prefix="mobius-ab-") as tmp:
        s = session(package, options(threads, "off", str(Path(tmp) / "p")))
        feeds = decode_feeds(s)  # the prefill is profiled too: keep only the last run
        s.run(["logits"], feeds)
        events = json.loads(Path(s.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    start = runs[-1]["ts"]
    return collections.Counter(
        e["args"]["op_name"]
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start
    )


def with_accuracy(package: Path, level: int, dst: Path) -> Path:
    """A copy of ``package`` (model graph rewritten, tokenizer linked) whose MatMulNBits run
    at ``accuracy_level = level``."""
    import onnx

    model = onnx.load(str(package / "model" / "model.onnx"))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = level
    (dst / "model").mkdir(parents=True)
    onnx.save(model, str(dst / "model" / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data")  # fmt: skip
    (dst / "tokenizer.json").symlink_to(package / "tokenizer.json")
    return dst


def prompt_ids(package: Path, n: int) -> list[int]:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(package / "tokenizer.json")).encode(TEXT).ids
    return (ids * (n // max(len(ids), 1) + 1))[:n]


def greedy(s, ids: list[int], new: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy ids and each step's last-position logits, with the KV cache of ``s``."""
    kv = [i for i in s.get_inputs() if i.name.startswith("past_key_values.")]
    outs = [o.name for o in s.get_outputs()]
    past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in kv}
    step, total, chosen, rows = np.array([ids], np.int64), 0, [], []
    for _ in range(new):
        n = step.shape[1]
        feeds = {
            "input_ids": step,
            "attention_mask": np.ones((1, total + n), np.int64),
            "position_ids": np.arange(total, total + n, dtype=np.int64)[None],
            **past,
        }
        values = dict(zip(outs, s.run(None, feeds)))
        logits = values["logits"][0, -1]
        rows.append(logits)
        chosen.append(int(np.argmax(logits)))
        past = {i.name: values[i.name.replace("past_key_values.", "present.")] for i in kv}
        total += n
        step = np.array([[chosen[-1]]], np.int64)
    return chosen, rows


def noise_floor(packages: dict[str, Path], threads: int, prompt_len: int) -> None:
    with tempfile.TemporaryDirectory(prefix="mobius-ab-") as tmp:
        variants = dict(packages)
        for k, p in packages.items():
            variants[k + "@0"] = with_accuracy(p, 0, Path(tmp) / k)
        ids = prompt_ids(packages["old"], prompt_len)
        rows = {}
        for k, p in variants.items():
            rows[k] = greedy(session(p, options(threads, "off")), ids, 1)[1][0]
    for a, b in [("old", "new"), ("old", "old@0"), ("new", "new@0"), ("old@0", "new@0")]:
        d = float(np.abs(rows[a] - rows[b]).max())
        print(f"prefill last row, {a} vs {b}: max |Δ logits| {d:.3g}")
    print(f"largest |logit| {float(np.abs(rows['old@0']).max()):.3g}; load {load_average()}")


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} / {five:.2f} (1 / 5 min) on {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spin", choices=("off", "on"), default="off")
    ap.add_argument("--new-tokens", "--new", dest="new_tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--accuracy-level", type=int, default=None)
    ap.add_argument("--noise-floor", action="store_true")
    args = ap.parse_args()
    import onnxruntime as ort

    packages = {"old": args.old, "new": args.new}
    if args.noise_floor:
        return noise_floor(packages, args.threads, args.prompt_len)
    work = None
    if args.accuracy_level is not None:
        work = tempfile.TemporaryDirectory(prefix="mobius-ab-")
        packages = {
            k: with_accuracy(p, args.accuracy_level, Path(work.name) / k)
            for k, p in packages.items()
        }
        print(f"MatMulNBits rewritten to accuracy_level {args.accuracy_level}")
    print(f"onnxruntime {ort.__version__}, {args.threads} threads, spinning {args.spin}")
    for name, package in packages.items():
        counts = nodes_per_step(package, args.threads)
        top = ", ".join(f"{op} {n}" for op, n in counts.most_common())
        print(f"{name} ({package}): {sum(counts.values())} nodes per decode step: {top}")

    sessions = {k: session(p, options(args.threads, args.spin)) for k, p in packages.items()}
    ids = prompt_ids(args.old, args.prompt_len)
    got = {k: greedy(s, ids, args.new_tokens) for k, s in sessions.items()}
    (a_ids, a_rows), (b_ids, b_rows) = got["old"], got["new"]
    same = next((i for i, (a, b) in enumerate(zip(a_ids, b_ids)) if a != b), None)
    upto = len(a_ids) if same is None else same + 1
    deltas = [float(np.abs(a - b).max()) for a, b in zip(a_rows[:upto], b_rows[:upto])]
    scale = max(float(np.abs(r).max()) for r in a_rows[:upto])
    print(
        f"greedy ids ({args.new_tokens} after {len(ids)}): "
        + ("equal" if same is None else f"part at token {same}")
        + f"; max |Δ logits| per step while fed the same ids: {max(deltas):.3g} "
        f"(median {statistics.median(deltas):.3g}; largest |logit| {scale:.3g})"
    )
    if same is not None:
        top2 = np.sort(a_rows[same])[-2:]
        print(f"  old's top-2 margin at token {same}: {float(top2[1] - top2[0]):.3g}")

    feeds = {k: decode_feeds(s) for k, s in sessions.items()}
    wall: dict[str, list[float]] = {k: [] for k in sessions}
    cpu: dict[str, list[float]] = {k: [] for k in sessions}
    names = list(sessions)
    before = load_average()
    for step in range(args.steps):
        for i in range(len(names)):
            name = names[(step + i) % len(names)]
            w, c = time.perf_counter(), time.process_time()
            sessions[name].run(["logits"], feeds[name])
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    after = load_average()
    med = {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in names}
    for k in names:
        (w, c), (bw, bc) = med[k], med["old"]
        print(
            f"{k}: decode step wall {w * 1e3:7.3f} ms ({w / bw:.3f}x old), "
            f"CPU {c * 1e3:7.3f} ms ({c / bc:.3f}x old)"
        )
    print(f"load average before {before}, after {after}")
    if work is not None:
        work.cleanup()


if __name__ == "__main__":
    main()
