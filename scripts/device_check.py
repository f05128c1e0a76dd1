"""The Python half of ``scripts/device_check.sh`` (run that; it sets up paths and the report).

For each checkpoint (the bundled tiny Gemma 4 and, unless ``--no-mid``, the seeded
~400 M random one of ``benchmarks/decode.py``): build a CPU f32 package and
``--target cuda`` packages in f16 and bf16 (and int4 when ``mobius.build`` takes a
``quant`` argument), run one prefill of the same prompt ids on each (CPU package on
CPU, CUDA packages on CUDA) and print top-1 agreement and max|Δ| of the logits
against the CPU f32 package; then greedy-decode on CUDA (IO binding keeps the KV
cache on the device) and print tokens/s against the memory-bandwidth limit: the
bandwidth measured here by a large on-device ``Add`` (read 2 × N, write N bytes)
divided by the bytes of the package's always-run components (an upper bound on
what one decode step reads, so the limit is conservative).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "testdata" / "tiny-gemma4"
# top-1 agreement that a low-precision CUDA package must reach against CPU f32
MIN_TOP1 = {"f16": 0.95, "bf16": 0.90, "int4": 0.80}


def log(message: str) -> None:
    print(message, flush=True)


def build(source: Path, out: Path, dtype: str, target: str, quant: str | None = None) -> Path:
    import mobius

    kwargs = {"dtype": dtype, "target": target}
    if quant:
        kwargs["quant"] = quant
    t0 = time.perf_counter()
    mobius.build(str(source), str(out), **kwargs)
    log(f"  built {out.name} in {time.perf_counter() - t0:.1f} s")
    return out


def prefill_logits(package: Path, device: str, ids: np.ndarray) -> np.ndarray:
    from mobius_runtime import Pipeline

    p = Pipeline.load(package, device=device)
    return np.asarray(p.forward(input_ids=ids)["logits"], dtype=np.float32)[0]


def bandwidth_gbps(mib: int = 512, runs: int = 10) -> float:
    """Device memory bandwidth measured with an f16 Add on CUDA (GB/s)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from mobius.onnx_versions import IR_VERSION, OPSET

    n = mib * 1024 * 1024 // 2
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "bandwidth",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT16, [n]) for x in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT16, [n])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    values = {
        x: ort.OrtValue.ortvalue_from_shape_and_type([n], np.float16, "cuda", 0) for x in "abc"
    }
    binding = session.io_binding()
    binding.bind_ortvalue_input("a", values["a"])
    binding.bind_ortvalue_input("b", values["b"])
    binding.bind_ortvalue_output("c", values["c"])
    session.run_with_iobinding(binding)
    times = []
    for _ in range(runs):
        binding.synchronize_inputs()
        t0 = time.perf_counter()
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        times.append(time.perf_counter() - t0)
    return 3 * n * 2 / statistics.median(times) / 1e9


def decode_rate(package: Path, ids: np.ndarray, new: int = 128, runs: int = 3) -> float:
    from mobius_runtime import Pipeline

    p = Pipeline.load(package, device="cuda")
    p.generate(input_ids=ids, max_new_tokens=4, stop_ids=())
    return statistics.median(
        p.generate(input_ids=ids, max_new_tokens=new, stop_ids=()).decode_tokens_per_s
        for _ in range(runs)
    )


def decode_bytes(package: Path) -> int:
    """Bytes of the components every decode step runs (graphs and external data)."""
    from mobius.package import read_package

    pkg = read_package(package)
    total = 0
    for spec in pkg.contract.components:
        if spec.presence is not None:
            continue
        folder = Path(pkg.components[spec.name]).parent
        total += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return total


def check_checkpoint(name: str, source: Path, work: Path, deadline: float, bw: float) -> bool:
    ok = True
    log(f"== {name}: {source}")
    ids = np.array([[2, *np.random.default_rng(0).integers(10, 300, 31).tolist()]], np.int64)
    reference = build(source, work / f"{name}-cpu-f32", "f32", "default")
    ref = prefill_logits(reference, "cpu", ids)
    variants = [("f16", None), ("bf16", None)]
    from mobius import builder

    if "quant" in inspect.signature(builder.build).parameters:
        variants.append(("int4", "int4"))  # int4 weights, f16 activations
    else:
        log("  int4: not built (this mobius-core's build has no quant option yet)")
    for label, quant in variants:
        if time.time() > deadline:
            log(f"  {label}: SKIPPED, the time budget is spent")
            continue
        dtype = "f16" if quant else label
        try:
            pkg = build(source, work / f"{name}-cuda-{label}", dtype, "cuda", quant)
            got = prefill_logits(pkg, "cuda", ids)
        except Exception as exc:  # report and go on: one variant must not hide the others
            log(f"  {label}: FAILED to build or run: {type(exc).__name__}: {exc}")
            ok = False
            continue
        top1 = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
        delta = float(np.abs(ref - got).max())
        passed = top1 >= MIN_TOP1[label] and np.isfinite(delta)
        ok &= passed
        log(
            f"  {label:5s} cuda vs f32 cpu: top-1 {top1:6.1%} (need {MIN_TOP1[label]:.0%}), "
            f"max|Δ| {delta:.3e} -> {'OK' if passed else 'FAILED'}"
        )
        if time.time() < deadline:
            rate = decode_rate(pkg, ids)
            size = decode_bytes(pkg)
            limit = bw * 1e9 / size
            log(
                f"  {label:5s} decode on cuda: {rate:8.1f} tok/s; bandwidth limit "
                f"{limit:8.1f} tok/s ({size / 2**20:.1f} MiB per step at {bw:.0f} GB/s): "
                f"{rate / limit:5.1%} of it"
            )
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description="device_check.sh's checks (run that script)")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=540)
    ap.add_argument("--started", type=float, default=None)
    ap.add_argument("--no-mid", action="store_true")
    args = ap.parse_args()
    deadline = (args.started or time.time()) + args.budget
    import onnxruntime as ort

    from mobius_runtime.device import cuda_usable

    if not cuda_usable():
        log(
            f"FAILED: nvidia-smi sees a GPU but onnxruntime {ort.__version__} cannot open a "
            "CUDA session here; install onnxruntime-gpu matching the CUDA driver and toolkit"
        )
        return 1
    bw = bandwidth_gbps()
    log(f"measured device memory bandwidth: {bw:.0f} GB/s (f16 Add, 512 MiB operands)")
    ok = check_checkpoint("tiny", TINY, args.work, deadline, bw)
    if not args.no_mid:
        if time.time() > deadline:
            log("mid: SKIPPED, the time budget is spent")
        else:
            try:
                sys.path.insert(0, str(ROOT / "benchmarks"))
                from decode import make_mid_checkpoint

                mid = make_mid_checkpoint(args.work / "mid-gemma4")
            except ImportError as exc:
                log(f"mid: SKIPPED, making the checkpoint needs torch + transformers ({exc})")
            else:
                ok &= check_checkpoint("mid", mid, args.work, deadline, bw)
    log(f"package checks: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
