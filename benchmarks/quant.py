"""Quantization benchmarks: accuracy, package bytes, decode speed, full-size build and run.

    python benchmarks/quant.py --which accuracy           # (a) ~100 M checkpoint: RMSE, top-1
    python benchmarks/quant.py --which decode             # (b) ~400 M: int4 vs f32 tok/s, bytes
    python benchmarks/quant.py --which e2b --dir DIR      # (c) synthetic full-size E2B build
    python benchmarks/quant.py --which e2b-run --dir DIR  # (d) run the E2B int4 package (c) kept
    python benchmarks/quant.py --which floor [--dir DIR]  # (e) the quantizer's compute floor

Figures are printed, never asserted (the machine is shared and noisy); each speed figure
is the median of --runs runs with the load average printed beside it.

(a) A seeded random Gemma 4 text checkpoint of ~100 M parameters (made with transformers
into /tmp, like benchmarks/decode.py) is built as f32 and as int4 (default target,
accuracy level 0); the int4 package's logits over a 128-token prompt are compared with the
f32 package's (RMSE over all positions, top-1 agreement), next to the f32 package
quantized by onnxruntime's MatMulNBitsQuantizer (RTN default config, block 32, symmetric)
on the same tensors: "matmul" = MatMul weights only (both sides), "all" = ours on every
MatMul / Gemm / Gather vs onnxruntime's on MatMul + Gather (it cannot do the tied Gemm).
Targets (issue 12): ours ≤ onnxruntime's; goal ≤ 0.85×.

(b) benchmarks/decode.py's ~400 M checkpoint built for --target cpu as f32 and as int4
(accuracy level 4): decode tokens/s of each (Pipeline.generate, 2 threads, 64 new tokens)
and package bytes. Targets: int4 ≥ 3× f32 tok/s, bytes ≤ 0.3× f32.

(c) benchmarks/build.py's synthetic full-size E2B bf16 checkpoint in DIR (reused if a
previous --keep left it), a cold ``cp -r`` + sync of it (page cache dropped where
permitted; the printout says when it could not be), then ``mobius build --quant
int4 --dtype f32 --target cpu`` in a child process, with ``--no-scale-search``
(round-to-nearest scales) and then the default scale search: wall time vs the copy, peak RSS
(VmHWM, file pages included), package size. Targets: RSS ≤ 2 GiB, wall ≤ 3× cp,
package ≤ 3.5 GB. Needs ~25 GB free; --keep keeps checkpoint and package for (d).

(d) The int4 package of (c): load through ``Pipeline`` on CPU, one prefill of 16 tokens +
8 decode steps: tokens/s and peak RSS.

(e) The block quantizer's own cost, CPU seconds per value (user + system of this process,
which the load average barely changes), for int4 block 32 on a seeded 2048 x 8192
float32 matrix: the default scale search and plain round-to-nearest (``search=False``,
onnxruntime's choice), and a float32 -> float16 cast of the same matrix for scale. With
(c)'s checkpoint kept in DIR it also prints the floor that implies for that build: its
matrix values / (per-value cost x the quantizer's threads), before any reading or
writing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
BENCH = Path("/tmp/mobius-bench")
GiB = 1024**3


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f}"


def package_bytes(package: Path) -> int:
    """Bytes on disk: a hard-linked shared table (mobius.package shared data) counts once."""
    from build import distinct_bytes

    return distinct_bytes(package)


def make_small_checkpoint(out: Path, seed: int = 0) -> Path:
    """A seeded random Gemma 4 text checkpoint of about 100 M parameters."""
    from decode import make_random_gemma4

    return make_random_gemma4(
        out,
        "small",
        seed,
        hidden_size=640,
        intermediate_size=2560,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        global_head_dim=256,
        vocab_size=32768,
        hidden_size_per_layer_input=64,
        vocab_size_per_layer_input=32768,
        num_kv_shared_layers=2,
    )


def build(source: Path, out: Path, **kw) -> tuple[Path, float]:
    import mobius

    t = time.perf_counter()
    mobius.build(str(source), str(out), force=True, **kw)
    return out, time.perf_counter() - t


def accuracy() -> None:
    from mobius.records import QuantOptions
    from mobius_testing.quant_accuracy import compare, ort_quantizer

    src = make_small_checkpoint(BENCH / "quant-small-gemma4")
    tables = ("embed_tokens.weight", "embed_tokens_per_layer.weight")
    f32, _ = build(src, BENCH / "quant-small-f32")
    mm, t_mm = build(src, BENCH / "quant-small-int4-matmul", quant=QuantOptions(exclude=tables))
    full, t_full = build(src, BENCH / "quant-small-int4", quant="int4")
    ids = [int(i) for i in np.random.default_rng(0).integers(3, 32000, size=128)]
    print(f"(a) ~100 M Gemma 4 text, 128-token prompt ({load()})")
    print(f"    int4 builds: {t_mm:.1f} s (MatMul weights), {t_full:.1f} s (all)")
    a = compare(f32, mm, ids, ort_quantizer(op_types=("MatMul",)))
    print(f"    matmul: {a.line()}")
    b = compare(f32, full, ids, ort_quantizer(op_types=("MatMul", "Gather")))
    print(f"    all:    {b.line()}")
    print(
        f"    bytes: f32 {package_bytes(f32) / 2**20:.0f} MiB, int4 {package_bytes(full) / 2**20:.0f}"
        f" MiB ({package_bytes(full) / package_bytes(f32):.3f} x)"
    )


def decode_speed(runs: int, threads: int, new: int) -> None:
    from decode import MID, make_mid_checkpoint

    from mobius_runtime import Pipeline

    src = make_mid_checkpoint(MID)
    f32, _ = build(src, BENCH / "quant-mid-f32-cpu", target="cpu")
    q4, t_q4 = build(src, BENCH / "quant-mid-int4-cpu", target="cpu", quant="int4")
    ids = [int(i) for i in np.random.default_rng(1).integers(3, 32000, size=32)]
    rates = {}
    for name, package in (("f32", f32), ("int4", q4)):
        p = Pipeline.load(package, device="cpu", threads=threads)
        p.generate(input_ids=ids, max_new_tokens=4, stop_ids=())
        results = [p.generate(input_ids=ids, max_new_tokens=new, stop_ids=()) for _ in range(runs)]
        rates[name] = statistics.median(r.decode_tokens_per_s for r in results)
        del p
    fb, qb = package_bytes(f32), package_bytes(q4)
    print(f"(b) ~400 M Gemma 4 text, --target cpu, {threads} threads, {new} new tokens ({load()})")
    print(f"    int4 build {t_q4:.1f} s")
    print(
        f"    decode tok/s: f32 {rates['f32']:.1f}, int4 {rates['int4']:.1f} "
        f"({rates['int4'] / rates['f32']:.2f} x; target >= 3 x)"
    )
    print(
        f"    bytes: f32 {fb / GiB:.3f} GiB, int4 {qb / GiB:.3f} GiB ({qb / fb:.3f} x; target <= 0.3)"
    )


BUILD_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import mobius
from mobius.records import QuantOptions
src, out = sys.argv[1:3]
search = sys.argv[3] != "rtn" if len(sys.argv) > 3 else True
try:
    quant = QuantOptions(method="int4", search=search)
    r = mobius.build(src, out, dtype="f32", target="cpu", quant=quant, force=True)
    info = {"components": dict(r.components), "n_tensors": r.n_tensors}
except Exception as exc:
    info = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
import os
os.sync()
info.update(wall_s=time.perf_counter() - t0,
            peak_rss=_peak_rss())
print(json.dumps(info))
"""

RUN_CHILD = r"""
import json, resource, sys, time
import numpy as np
from mobius_runtime import Pipeline
t0 = time.perf_counter()
p = Pipeline.load(sys.argv[1], device="cpu", threads=int(sys.argv[2]))
t_load = time.perf_counter() - t0
ids = [int(i) for i in np.random.default_rng(2).integers(3, 200000, size=16)]
r = p.generate(input_ids=ids, max_new_tokens=9, stop_ids=())
print(json.dumps({"load_s": t_load, "prefill_ms": r.prefill_ms,
                  "decode_tok_s": r.decode_tokens_per_s, "ids": r.ids,
                  "peak_rss": _peak_rss()}))
"""


def _child(code: str, *args: str) -> dict:
    from build import _child as run_child  # one JSON-line child runner for the benchmarks

    return run_child(code, *args)


def e2b_build(root: Path, keep: bool) -> None:
    from build import (
        CONFIGS,
        _kept_checkpoint,
        claim_bench_dir,
        timed_cold_copy,
        write_synthetic_checkpoint,
    )

    claim_bench_dir(root)
    ckpt, copy, out = root / "e2b-synthetic", root / "e2b-copy", root / "e2b-int4-package"
    marker = root / "e2b-synthetic.complete.json"
    kept = _kept_checkpoint(ckpt, marker)
    free = shutil.disk_usage(root).free + (kept or 0)
    if free < 25 * GiB:
        print(f"(c) skipped: {free / GiB:.1f} GiB free in {root}, need ~25 GiB")
        return
    shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    try:
        if kept:
            nbytes = kept
        else:
            nbytes = write_synthetic_checkpoint(ckpt, CONFIGS / "gemma-4-E2B-it.json")
            os.sync()
            sizes = {p.name: p.stat().st_size for p in ckpt.glob("*.safetensors")}
            marker.write_text(json.dumps({"total_size": nbytes, "files": sizes}))
        print(f"(c) synthetic E2B: {nbytes / GiB:.2f} GiB of bf16 tensors in {ckpt} ({load()})")
        t_copy, state = timed_cold_copy(ckpt, copy)
        print(f"    cp -r + sync: {t_copy:.1f} s ({state})")
        # both scale choices; the default (search) last: it is the package (d) runs
        for how, flag in (("rtn", " --no-scale-search"), ("search", "")):
            res = _child(BUILD_CHILD, str(ckpt), str(out), how)
            if "error" in res:
                print(f"    build ERROR: {res['error']}")
                return
            size = package_bytes(out)
            parts = ", ".join(f"{n} {s / GiB:.2f} GiB" for n, s in res["components"].items())
            print(f"    mobius build --quant int4{flag} --dtype f32 --target cpu: {parts}")
            print(
                f"    wall {res['wall_s']:.1f} s = {res['wall_s'] / t_copy:.2f} x cp -r "
                f"(target <= 3); peak RSS {res['peak_rss'] / GiB:.2f} GiB (target <= 2); "
                f"package {size / 1e9:.2f} GB (target <= 3.5) ({load()})"
            )
    finally:
        if not keep:
            for p in (ckpt, copy, out):
                shutil.rmtree(p, ignore_errors=True)
            marker.unlink(missing_ok=True)


def e2b_run(root: Path, threads: int) -> None:
    out = root / "e2b-int4-package"
    if not (out / "mobius.json").is_file():
        print(f"(d) skipped: no package at {out} (run --which e2b --keep first)")
        return
    res = _child(RUN_CHILD, str(out), str(threads))
    if "error" in res:
        print(f"(d) ERROR: {res['error']}")
        return
    print(
        f"(d) E2B int4 (synthetic weights) on CPU, {threads} threads: load {res['load_s']:.1f} s, "
        f"prefill 16 tokens {res['prefill_ms']:.0f} ms, 8 decode steps "
        f"{res['decode_tok_s']:.2f} tok/s, peak RSS {res['peak_rss'] / GiB:.2f} GiB ({load()})"
    )


def _cpu_s() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def checkpoint_values(folder: Path) -> int:
    """Values in the 2-D and larger tensors of a safetensors folder (from the headers)."""
    import math
    import struct

    total = 0
    for path in folder.glob("*.safetensors"):
        with path.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name != "__metadata__" and len(info["shape"]) >= 2:
                total += math.prod(info["shape"])
    return total


def quant_floor(root: Path, runs: int) -> None:
    from mobius.weights.quantize import QUANT_THREADS, quantize_rows

    w = np.random.default_rng(0).standard_normal((2048, 8192), dtype=np.float32)
    costs = {}
    for label, kw in (("scale search (default)", {}), ("round-to-nearest", {"search": False})):
        cpu = []
        for _ in range(runs):
            start = _cpu_s()
            quantize_rows(w, bits=4, block_size=32, **kw)
            cpu.append(_cpu_s() - start)
        costs[label] = statistics.median(cpu) / w.size
    start = _cpu_s()
    w.astype(np.float16)
    cast = (_cpu_s() - start) / w.size
    print(f"(e) int4 block-32 quantizer, {w.shape[0]} x {w.shape[1]} float32, median of {runs}:")
    for label, cost in costs.items():
        print(
            f"    {label:24} {cost * 1e9:6.1f} cpu-ns / value = {1e-6 / cost:6.1f} M values / cpu-s"
        )
    print(f"    {'f32 -> f16 cast':24} {cast * 1e9:6.1f} cpu-ns / value ({load()})")
    ckpt = root / "e2b-synthetic"
    if ckpt.is_dir():
        values = checkpoint_values(ckpt)
        print(f"    (c)'s checkpoint: {values / 1e9:.2f} G matrix values; quantizing them alone, "
              f"{QUANT_THREADS} threads:")  # fmt: skip
        for label, cost in costs.items():
            print(f"      {label:24} >= {values * cost / QUANT_THREADS:.0f} s wall")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--which", nargs="+", default=["accuracy", "decode"],
        choices=["accuracy", "decode", "e2b", "e2b-run", "floor"],
    )  # fmt: skip
    ap.add_argument("--dir", type=Path, default=BENCH / "quant-e2b", help="folder for (c), (d)")
    ap.add_argument("--keep", action="store_true", help="keep (c)'s checkpoint and package")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args(argv)
    if "accuracy" in args.which:
        accuracy()
    if "decode" in args.which:
        decode_speed(args.runs, args.threads, args.new)
    if "e2b" in args.which:
        e2b_build(args.dir, args.keep)
    if "e2b-run" in args.which:
        e2b_run(args.dir, args.threads)
    if "floor" in args.which:
        quant_floor(args.dir, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
