"""Routed MoE against the dense formulation: prefill ms and decode tokens/s, same weights.

A seeded random Gemma 4 text MoE checkpoint (about 300 M parameters: 8 layers, hidden
768, 64 experts top-4 with moe_intermediate 256 beside a dense MLP of 1024 — 26B-A4B's
expert-to-top_k ratio of 16) is made with transformers into /tmp, then built twice with
the same weights:

  routed — what ``mobius build`` makes: only the experts the step's tokens picked are
           gathered and multiplied (core ``RoutedExperts``);
  dense  — the formulation before routing (every expert for every token, weighted by a
           dense [T, E] matrix that is zero outside the top-k), built inside
           ``mobius.components.experts.dense_formulation()``.

Both run greedy generation with mobius-runtime on the same prompt (default 128 tokens)
and thread count; the ids must be identical. Printed: prefill latency, decode tokens/s,
the routed/dense ratios (median of --runs runs), the weight bytes a decode token reads
(from the graph) and the machine's load average (figures are only comparable between runs
on an equally loaded machine).

With ``--quant int4`` (or int8) a third package, routed with quantized weights, is
measured too; its greedy ids are compared with the float ones (agreement printed, not
required: quantization changes the numbers).

Usage: python benchmarks/moe.py [--target cpu] [--threads 2] [--prompt-len 128] [--new 32]
                                [--runs 3] [--quant int4] [--no-build]
Issue targets (not asserted): decode routed >> dense; prefill routed <= dense.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "testdata" / "tiny-gemma4"
WORK = Path("/tmp/mobius-bench")
CHECKPOINT = WORK / "moe-gemma4"


def make_moe_checkpoint(out: Path, seed: int = 0) -> Path:
    """A seeded random Gemma 4 text MoE checkpoint of about 300 M parameters."""
    from decode import make_random_gemma4

    return make_random_gemma4(
        out,
        "MoE",
        seed,
        layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2,
        randomize=("router.scale", "router.per_expert_scale"),
        hidden_size=768,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        global_head_dim=256,
        vocab_size=32768,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=32768,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        sliding_window=512,
        enable_moe_block=True,
        num_experts=64,
        top_k_experts=4,
        moe_intermediate_size=256,
    )


def build(source: Path, out: Path, target: str, dense: bool, quant: str | None = None) -> Path:
    import contextlib

    import mobius
    from mobius.components.experts import dense_formulation

    with dense_formulation() if dense else contextlib.nullcontext():
        mobius.build(str(source), str(out), target=target, quant=quant, force=True)
    return out


def read_bytes(package: Path) -> tuple[int, int]:
    """Weight bytes per decode token (routed, dense) of the package's text graph."""
    import onnx_ir as ir

    from mobius.components.experts import decode_weight_bytes

    manifest = json.loads((package / "mobius.json").read_text())
    graph = ir.load(str(package / manifest["components"]["model"]["path"])).graph
    cfg = json.loads((CHECKPOINT / "config.json").read_text())
    return decode_weight_bytes(graph, cfg["num_experts"], cfg["top_k_experts"])


def bench(package: Path, ids: list[int], new: int, threads: int, runs: int):
    from mobius_runtime import Pipeline

    p = Pipeline.load(package, device="cpu", threads=threads)
    p.generate(input_ids=ids, max_new_tokens=4, stop_ids=())  # warm-up
    results = [p.generate(input_ids=ids, max_new_tokens=new, stop_ids=()) for _ in range(runs)]
    for r in results[1:]:
        assert r.ids == results[0].ids, "mobius-runtime is not deterministic"
    return (
        results[0].ids,
        statistics.median(r.prefill_ms for r in results),
        statistics.median(r.decode_tokens_per_s for r in results),
    )


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} (1 / 5 min) on {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cpu", choices=["default", "cpu"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--quant", choices=["int4", "int8"], help="also measure a quantized routed build"
    )
    ap.add_argument("--no-build", action="store_true", help="reuse /tmp/mobius-bench packages")
    args = ap.parse_args()
    source = make_moe_checkpoint(CHECKPOINT)
    ids = [2, *np.random.default_rng(0).integers(10, 30000, args.prompt_len - 1).tolist()]
    rows = {}
    kinds = ["routed", "dense"] + ([f"routed-{args.quant}"] if args.quant else [])
    for kind in kinds:
        package = WORK / f"moe-{kind}-{args.target}-pkg"
        if not (args.no_build and (package / "mobius.json").is_file()):
            quant = args.quant if kind.endswith(("int4", "int8")) else None
            build(source, package, args.target, dense=kind == "dense", quant=quant)
        rows[kind] = (*bench(package, ids, args.new, args.threads, args.runs), read_bytes(package))
    (r_ids, r_pre, r_tps, (r_bytes, _)), (d_ids, d_pre, d_tps, (d_bytes, _)) = (
        rows["routed"],
        rows["dense"],
    )
    assert r_ids == d_ids, f"ids differ\n routed {r_ids}\n dense  {d_ids}"
    print(
        f"MoE 64 experts top-4, --target {args.target}: prompt {len(ids)}, {args.new} new "
        f"tokens, {args.threads} threads, median of {args.runs}; {load_average()}"
    )
    for kind, pre, tps, nbytes in (
        ("routed", r_pre, r_tps, r_bytes),
        ("dense", d_pre, d_tps, d_bytes),
    ):
        print(
            f"  {kind:6s}: prefill {pre:8.1f} ms, decode {tps:7.1f} tok/s, "
            f"weights read per decode token {nbytes / 2**20:7.1f} MiB"
        )
    print(
        f"  routed / dense: prefill time {r_pre / d_pre:.2f}x, decode speed {r_tps / d_tps:.2f}x, "
        f"bytes {r_bytes / d_bytes:.2f}x\n  identical greedy ids: yes"
    )
    if args.quant:
        q_ids, q_pre, q_tps, (q_bytes, q_all) = rows[f"routed-{args.quant}"]
        same = sum(a == b for a, b in zip(q_ids, r_ids))
        print(
            f"  routed {args.quant}: prefill {q_pre:8.1f} ms, decode {q_tps:7.1f} tok/s, "
            f"weights read per decode token {q_bytes / 2**20:7.1f} MiB (every expert: "
            f"{q_all / 2**20:.1f} MiB); decode speed {q_tps / r_tps:.2f}x routed f32; "
            f"greedy ids equal to f32 at {same}/{len(r_ids)} positions"
        )


if __name__ == "__main__":
    main()
