"""Greedy decode with onnxruntime-genai on a mobius package (run in onnxruntime-genai's venv).

Called by ``benchmarks/decode.py`` in a subprocess of the venv that holds
onnxruntime-genai (it brings its own onnxruntime, so it never shares one with
onnxruntime-gpu). The model is loaded and warmed up once; then each line read from
stdin runs one greedy generation and answers one JSON line: the generated ids, the
prefill ms and the decode tokens/s, measured as mobius-runtime measures them
(prefill: appending the prompt and choosing the first id; decode: the steps after
it, per generated token). ``decode.py`` alternates these with its own generations so
that both see the same machine load. A line ``quit`` (or end of input) ends it.

Usage: python og_decode.py PACKAGE --ids 2,40,41 --new 64 [--threads 2]
Without ``--threads`` onnxruntime-genai keeps its own default session options (the fair
comparison: forcing 2 intra-op threads made it up to 2x slower on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    import onnxruntime_genai as og

    ap = argparse.ArgumentParser()
    ap.add_argument("package")
    ap.add_argument("--ids", required=True, help="comma-separated prompt ids")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="default: og's own options")
    args = ap.parse_args()
    ids = [int(i) for i in args.ids.split(",")]
    config = og.Config(args.package)
    config.clear_providers()
    if args.threads is not None:
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
    import onnxruntime

    versions = f"onnxruntime-genai {og.__version__}, onnxruntime {onnxruntime.__version__}"
    print(json.dumps({"ready": True, "versions": versions}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        ids_out, prefill_ms, rate = once(args.new)
        answer = {"ids": ids_out, "prefill_ms": prefill_ms, "decode_tokens_per_s": rate}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
