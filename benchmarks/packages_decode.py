"""Greedy decode speed of packages of one model (e.g. two ``--target cpu`` builds of a
GGUF file in different weight forms), in one process, the packages taking turns.

``python benchmarks/packages_decode.py PACKAGE [PACKAGE ...] [--runs 9] [--new 64]
[--prompt-len 32] [--threads 2]``: each package is loaded with ``Pipeline.load`` (the
runtime's own session options, so every package sees the same ones), warmed up, then
generates ``--new`` greedy tokens after the same ``--prompt-len`` prompt ids, one
generation per package per round; prints the median decode tokens/s and prefill time of
each and the process CPU time of a whole generation (all threads: on a shared machine
the steadier measure of the work), their ratios to the first package, whether the greedy ids equal the first
package's, and the load average before and after (the machine is shared: compare the
figures of one run only). No assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packages", nargs="+")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from mobius_runtime import Pipeline

    ids = [2, *np.random.default_rng(0).integers(10, 300, args.prompt_len - 1).tolist()]
    pipes = {p: Pipeline.load(p, device="cpu", threads=args.threads) for p in args.packages}
    for p in pipes.values():
        p.generate(input_ids=ids, max_new_tokens=4, stop_ids=())
    speed: dict[str, list[float]] = {k: [] for k in pipes}
    prefill: dict[str, list[float]] = {k: [] for k in pipes}
    cpu: dict[str, list[float]] = {k: [] for k in pipes}
    out: dict[str, list[int]] = {}
    before = os.getloadavg()
    for _ in range(args.runs):
        for name, p in pipes.items():
            c = time.process_time()
            r = p.generate(input_ids=ids, max_new_tokens=args.new, stop_ids=())
            cpu[name].append(time.process_time() - c)
            speed[name].append(r.decode_tokens_per_s)
            prefill[name].append(r.prefill_ms)
            out[name] = list(r.ids)
    after = os.getloadavg()
    first = args.packages[0]
    base = [statistics.median(d[first]) for d in (speed, prefill, cpu)]
    for name in pipes:
        s, pf, c = (statistics.median(d[name]) for d in (speed, prefill, cpu))
        same = "the same ids as" if out[name] == out[first] else "other ids than"
        print(
            f"{name}: decode {s:6.1f} tok/s ({s / base[0]:.3f}x), prefill {pf:6.1f} ms "
            f"({pf / base[1]:.3f}x), CPU {c * 1e3:7.1f} ms a generation ({c / base[2]:.3f}x), "
            f"{same} {first}"
        )
    print(
        f"load average before {before[0]:.2f} / {before[1]:.2f}, after {after[0]:.2f} / "
        f"{after[1]:.2f} (1 / 5 min) on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
