"""Per-token time outside onnxruntime's kernels in mobius-runtime's token loop.

For each package: greedy generations of ``--new`` tokens; each decode step's
``run_with_iobinding`` is timed, and the decode wall time minus those runs, per token,
is the loop's own work (binding, feeds, picking, stopping). Prints the median and the
fastest generation (on a shared machine the fastest is the cleanest estimate) and the
time inside onnxruntime, plus the load average.

Usage: python benchmarks/step_overhead.py PACKAGE [PACKAGE ...] [--runs 15] [--new 64]
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
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from mobius_runtime import Pipeline, iobind

    runs: list[float] = []

    class Timed:
        def __init__(self, sess) -> None:
            self.sess = sess

        def run_with_iobinding(self, *a):
            start = time.perf_counter()
            try:
                return self.sess.run_with_iobinding(*a)
            finally:
                runs.append(time.perf_counter() - start)

    real_init = iobind.StepBinding.__init__

    def init(self, session) -> None:
        real_init(self, session)
        if self._sess is None:
            raise SystemExit("this onnxruntime has no C-level session to time")
        self._sess = Timed(self._sess)

    iobind.StepBinding.__init__ = init
    ids = [2, *np.random.default_rng(0).integers(10, 300, 31).tolist()]
    pipes = {p: Pipeline.load(p, device="cpu", threads=args.threads) for p in args.packages}
    for p in pipes.values():
        p.generate(input_ids=ids, max_new_tokens=4, stop_ids=())
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in pipes}
    for _ in range(args.runs):  # the packages take turns
        for name, p in pipes.items():
            runs.clear()
            r = p.generate(input_ids=ids, max_new_tokens=args.new, stop_ids=())
            inside = sum(runs[1:])  # runs[0] is the prefill
            steps = len(r.ids) - 1
            rows[name].append(((r.decode_ms / 1000 - inside) / steps * 1e6, inside / steps * 1e6))
    one, five, _ = os.getloadavg()
    for name, got in rows.items():
        outside = [g[0] for g in got]
        print(
            f"{name}: outside onnxruntime {statistics.median(outside):.0f} us/token "
            f"(fastest {min(outside):.0f}), inside {statistics.median(g[1] for g in got):.0f}"
        )
    print(f"load average {one:.2f} / {five:.2f} (1 / 5 min) on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
