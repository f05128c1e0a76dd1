"""Start-up cost: ``Pipeline.load`` against bare onnxruntime session creation for the same graphs.

For each package, in alternating order so both see the same page cache and load:

* ``ort``     — one ``onnxruntime.InferenceSession`` per component ``Pipeline.load``
                opens eagerly, with the runtime's own session options;
* ``load``    — ``Pipeline.load`` (package check trusting the verification stamp,
                plan, sessions, port checks);
* ``hashing`` — ``Pipeline.load`` after the stamp is deleted (every file hashed,
                graphs checked, stamp rewritten): what every load cost before the stamp.

Printed: the median of --runs runs of each, the ratio load/ort (goal: <= 1.3) and
the machine's 1-minute load average (figures are comparable only between runs
on an equally loaded machine). Packages:

  (a) tiny  — testdata/tiny-gemma4 built with ``mobius build`` (into /tmp)
  (b) large — a synthetic package written locally with ``write_package``: a chain
              of --layers float32 MatMul layers of --width² weights (default
              24 × 2048² × 4 B ≈ 400 MB), no checkpoint needed

Usage: python benchmarks/load.py [--which tiny large] [--runs 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "testdata" / "tiny-gemma4"
WORK = Path(tempfile.gettempdir()) / "mobius-bench-load"


def tiny_package() -> Path:
    import mobius

    out = WORK / "tiny"
    if not (out / "mobius.json").is_file():
        mobius.build(str(TINY), str(out), force=True)
    return out


def large_package(layers: int, width: int) -> Path:
    """y = relu(...relu(x @ W0)... @ Wn): ``layers`` float32 weights of width x width."""
    import onnx_ir as ir

    from mobius.contract import Component, Contract, ExternalInput, Port
    from mobius.package import write_package

    out = WORK / f"large-{layers}x{width}"
    if (out / "mobius.json").is_file():
        return out
    rng = np.random.default_rng(0)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", width]))
    nodes, current, weights = [], x, []
    for i in range(layers):
        w = ir.Value(
            name=f"w{i}", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([width, width])
        )
        w.const_value = ir.tensor(
            rng.standard_normal((width, width), dtype=np.float32) / width, name=f"w{i}"
        )
        weights.append(w)
        matmul = ir.Node("", "MatMul", [current, w], num_outputs=1)
        relu = ir.Node("", "Relu", [matmul.outputs[0]], num_outputs=1)
        nodes += [matmul, relu]
        current = relu.outputs[0]
    current.name, current.type = "y", ir.TensorType(ir.DataType.FLOAT)
    current.shape = ir.Shape(["batch", width])
    graph = ir.Graph([x], [current], nodes=nodes, opset_imports={"": 21})
    for w in weights:
        graph.initializers[w.name] = w
    contract = Contract(
        components=(
            Component(
                "model",
                inputs=(Port("x", "float32", ("batch", width)),),
                outputs=(Port("y", "float32", ("batch", width)),),
            ),
        ),
        externals=(ExternalInput("model.x", "x"),),
        outputs=("model.y",),
    )
    manifest = {"model_type": "synthetic", "task": "feature-extraction", "dtype": "f32"}
    manifest["contract"] = contract.to_dict()
    write_package(out, components={"model": ir.Model(graph, ir_version=10)}, manifest=manifest)
    return out


def bare_ort(package: Path, threads: int) -> float:
    """Seconds to create the sessions Pipeline.load creates, with the same options."""
    from mobius.package import read_package
    from mobius_runtime.device import providers_for
    from mobius_runtime.ort_sessions import open_session

    pkg = read_package(package)
    providers_for("cpu")  # import onnxruntime outside the timed region
    eager = [c.name for c in pkg.contract.components if c.presence is None]
    started = time.perf_counter()
    sessions = [open_session(pkg.components[name], "cpu", threads) for name in eager]
    elapsed = time.perf_counter() - started
    del sessions  # freed outside the timed region, as the Pipeline's are
    return elapsed


def mobius_load(package: Path, threads: int) -> float:
    from mobius_runtime import Pipeline

    started = time.perf_counter()
    pipeline = Pipeline.load(package, device="cpu", threads=threads)
    elapsed = time.perf_counter() - started
    del pipeline
    return elapsed


def hashing_load(package: Path, threads: int) -> float:
    from mobius.package.stamp import STAMP_NAME

    (package / STAMP_NAME).unlink(missing_ok=True)
    return mobius_load(package, threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--which", nargs="+", default=["tiny", "large"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)

    packages = {}
    for which in args.which:
        if which == "tiny":
            packages["tiny"] = tiny_package()
        elif which == "large":
            packages["large"] = large_package(args.layers, args.width)
        else:
            parser.error(f"unknown package {which!r} (tiny, large)")

    mobius_load(next(iter(packages.values())), args.threads)  # imports, warm-up
    print(f"{'package':8} {'MB':>7} {'ort ms':>9} {'load ms':>9} {'ratio':>6} {'hashing ms':>11}")
    for name, package in packages.items():
        size = sum(f.stat().st_size for f in package.rglob("*") if f.is_file()) / 1e6
        times: dict[str, list[float]] = {"ort": [], "load": [], "hashing": []}
        measures = {"ort": bare_ort, "load": mobius_load, "hashing": hashing_load}
        for run in range(args.runs):
            # rotate the order, so no measure always follows the page-cache-heavy hashing
            names = list(measures)[run % 3 :] + list(measures)[: run % 3]
            for key in names:
                gc.collect()  # a Pipeline holds cycles: free the previous one's sessions now
                times[key].append(measures[key](package, args.threads))  # hashing re-stamps
        o, m, h = (statistics.median(times[k]) * 1000 for k in ("ort", "load", "hashing"))
        print(f"{name:8} {size:7.1f} {o:9.1f} {m:9.1f} {m / o:6.2f} {h:11.1f}")
    print(f"runs: {args.runs} (medians), threads: {args.threads}, load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
