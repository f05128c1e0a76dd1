"""onnxruntime-genai's whole decode token against the onnxruntime Python binding's run of
the same graph, in one process.

Runs in onnxruntime-genai's venv (it brings plain ``onnxruntime``; the binding measured is
that package's). For a concat-KV package (``mobius build SRC PKG``, ``--target default``):
og generates greedy tokens at its own default session options and the time of each
``generate_next_token`` is taken (its run, sampling and KV handling); a bare
``InferenceSession`` with og's thread count (``--threads``, default 1: og's own default on
a 2-core machine, ``hardware_concurrency / 2``) decodes the same prompt, and the time of
its onnxruntime call alone is taken three ways: ``run_with_iobinding`` with outputs
allocated by onnxruntime, with every output preallocated, and ``InferenceSession.run``
with numpy feeds. Prints the medians (of the per-step medians of ``--runs`` generations,
taken in turns) and the load average, and checks that both sides chose the same ids.
When og's whole token is faster than the binding's run alone, no Python token loop over
that binding can match og on that model.

Usage: .venv-og/bin/python benchmarks/og_run_cost.py PACKAGE [--new 64] [--runs 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def main() -> None:
    import onnxruntime as ort
    import onnxruntime_genai as og

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    config = og.Config(args.package)
    config.clear_providers()
    model = og.Model(config)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(f"{args.package}/model/model.onnx", options)
    inputs = {i.name: i for i in session.get_inputs()}
    pasts = [n for n in inputs if n.startswith("past_key_values")]
    outputs = [o.name for o in session.get_outputs()]
    if any(isinstance(inputs[n].shape[2], int) for n in pasts):
        raise SystemExit(
            "this script needs a concat-KV package (mobius build ... --target default)"
        )
    C = ort.OrtValue
    prompt = [2, *np.random.default_rng(0).integers(10, 300, 31).tolist()]
    vocab = session.get_outputs()[0].shape[2]

    def ours(mode: str) -> tuple[float, list[int]]:
        total = len(prompt)
        feeds = {
            n: np.zeros((1, inputs[n].shape[1], 0, inputs[n].shape[3]), np.float32) for n in pasts
        }
        feeds.update(
            input_ids=np.array([prompt]),
            attention_mask=np.ones((1, total), np.int64),
            position_ids=np.arange(total)[None],
        )
        wrapper = session.io_binding()  # owns the C-level binding: kept while it is used
        binding = wrapper._iobinding
        values = {k: C.ortvalue_from_numpy(v) for k, v in feeds.items()}
        times, ids = [], []
        for step in range(args.new):
            length = total + step
            if mode == "run":
                t = time.perf_counter()
                got = session.run(outputs, feeds)
                times.append(time.perf_counter() - t)
                logits, presents = got[0], got[1:]
            else:
                wrapper.clear_binding_inputs()
                wrapper.clear_binding_outputs()
                for k, v in values.items():
                    wrapper.bind_ortvalue_input(k, v)
                held = []
                if mode == "preallocated":
                    rows = total if step == 0 else 1
                    held.append(C.ortvalue_from_numpy(np.empty((1, rows, vocab), np.float32)))
                    for n in pasts:
                        shape = (1, inputs[n].shape[1], length, inputs[n].shape[3])
                        held.append(C.ortvalue_from_numpy(np.empty(shape, np.float32)))
                    for name, value in zip(outputs, held):
                        wrapper.bind_ortvalue_output(name, value)
                else:
                    for name in outputs:
                        wrapper.bind_output(name, "cpu")
                t = time.perf_counter()
                session._sess.run_with_iobinding(binding, None)
                times.append(time.perf_counter() - t)
                got = held or wrapper.get_outputs()
                logits, presents = got[0].numpy(), got[1:]
            ids.append(int(logits[0, -1].argmax()))
            step_ids = np.array([[ids[-1]]])
            mask = np.ones((1, length + 1), np.int64)
            positions = np.array([[length]])
            if mode == "run":
                feeds = dict(zip(pasts, presents))
                feeds.update(input_ids=step_ids, attention_mask=mask, position_ids=positions)
            else:
                values = dict(zip(pasts, presents))
                for k, v in (
                    ("input_ids", step_ids),
                    ("attention_mask", mask),
                    ("position_ids", positions),
                ):
                    values[k] = C.ortvalue_from_numpy(v)
        return statistics.median(times[1:]) * 1e6, ids

    def genai() -> tuple[float, list[int]]:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + args.new, min_length=0)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        times, ids = [], []
        for _ in range(args.new):
            t = time.perf_counter()
            generator.generate_next_token()
            times.append(time.perf_counter() - t)
            ids.append(int(generator.get_next_tokens()[0]))
        return statistics.median(times[1:]) * 1e6, ids

    sides = {
        "og generate_next_token (whole token)": genai,
        "binding run_with_iobinding (run alone)": lambda: ours("bound"),
        "binding, outputs preallocated (run alone)": lambda: ours("preallocated"),
        "binding InferenceSession.run (call alone)": lambda: ours("run"),
    }
    for side in sides.values():
        side()  # warm-up
    got: dict[str, list[float]] = {name: [] for name in sides}
    reference = None
    for _ in range(args.runs):
        for name, side in sides.items():
            us, ids = side()
            got[name].append(us)
            reference = reference or ids
            if ids != reference:
                raise SystemExit(f"{name}: greedy ids differ from og's")
    one, five, _ = os.getloadavg()
    print(
        f"{args.package}: {args.new} greedy tokens, {args.threads} intra-op thread(s), median of "
        f"{args.runs} generations in turns; onnxruntime-genai {og.__version__}, onnxruntime "
        f"{ort.__version__}; load average {one:.2f} / {five:.2f} on {os.cpu_count()} cores"
    )
    for name, values in got.items():
        print(f"  {name:45s} {statistics.median(values):7.1f} us")
    print("  identical greedy ids: yes")


if __name__ == "__main__":
    main()
