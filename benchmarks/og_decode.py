"""Greedy decode with onnxruntime-genai on a mobius package (run in onnxruntime-genai's venv).

Called by ``benchmarks/decode.py`` in a subprocess of the venv that holds
onnxruntime-genai (it brings its own onnxruntime, so it never shares one with
onnxruntime-gpu). Prints one JSON line: the generated ids, the median prefill ms
and the median decode tokens/s over ``--runs`` runs, measured as mobius-runtime
measures them (prefill: appending the prompt; decode: the steps after the first
token, per generated token).

Usage: python og_decode.py PACKAGE --ids 2,40,41 --new 64 --threads 2 --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    import onnxruntime_genai as og

    ap = argparse.ArgumentParser()
    ap.add_argument("package")
    ap.add_argument("--ids", required=True, help="comma-separated prompt ids")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    ids = [int(i) for i in args.ids.split(",")]
    config = og.Config(args.package)
    config.clear_providers()
    threads = {"intra_op_num_threads": args.threads, "inter_op_num_threads": 1}
    with open(f"{args.package}/genai_config.json", encoding="utf-8") as f:
        sections = [k for k in json.load(f)["model"] if isinstance(k, str)]
    overlay = {"model": {}}
    for name in ("decoder", "embedding"):
        if name in sections:
            overlay["model"][name] = {"session_options": threads}
    config.overlay(json.dumps(overlay))
    model = og.Model(config)

    def once(new: int) -> tuple[list[int], float, float]:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + new, min_length=0)
        generator = og.Generator(model, params)
        t0 = time.perf_counter()
        generator.append_tokens(ids)
        generator.generate_next_token()  # the first id comes from the prefill's logits
        out = [int(generator.get_next_tokens()[0])]
        t1 = time.perf_counter()
        while len(out) < new and not generator.is_done():
            generator.generate_next_token()
            out.append(int(generator.get_next_tokens()[0]))
        t2 = time.perf_counter()
        return out, (t1 - t0) * 1000.0, (len(out) - 1) / max(t2 - t1, 1e-9)

    once(4)  # warm-up
    runs = [once(args.new) for _ in range(args.runs)]
    print(
        json.dumps(
            {
                "ids": runs[0][0],
                "prefill_ms": statistics.median(r[1] for r in runs),
                "decode_tokens_per_s": statistics.median(r[2] for r in runs),
            }
        )
    )


if __name__ == "__main__":
    main()
