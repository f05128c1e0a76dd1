"""`mobius serve` under concurrent clients: aggregate tokens/s, time to first token, per-token latency.

For each package: build it (``--target cpu``: GroupQueryAttention, shared KV buffers),
start ``mobius serve`` as its own process on 127.0.0.1, then run the same workload —
``--requests`` streamed greedy completions of ``--new`` tokens, each on its own seeded
token-id prompt — with 1, 4 and 8 concurrent clients (the workload is split between
them, so every row generates the same tokens). Per row: aggregate completion tokens/s
over the row's wall time (the median of ``--runs`` runs), its ratio to the 1-client row
of the same run, p50/p99 time to first token, p50/p99 per-token latency (a request's
time from first to last token / its tokens - 1), and the load average (figures are
only comparable on an equally loaded machine). Packages:

  (a) tiny — testdata/tiny-gemma4 (bundled)
  (b) mid  — the seeded random ~400 M-parameter Gemma 4 text checkpoint that
             benchmarks/decode.py makes with transformers into /tmp

With ``--engine``, rows ``<package>/eng`` first run the same workload through
``mobius_runtime.engine.Engine`` in this process (no HTTP, JSON or client work), which
separates what batching gains from what the HTTP layer costs per token.

Each HTTP client runs in its own process (spawned, started together once all have
imported their HTTP client), so clients do not contend for one GIL while they parse
the server-sent events; ``--client-threads`` runs them as threads of the benchmark
process instead (the old way), ``--both-client-modes`` runs both against the same
server (rows ``<package>/proc`` and ``<package>/thr``).

With ``--constrained``, rows ``<package>/free``, ``/json`` and ``/mix`` run the engine
workload with no constraint, with every request constrained to one JSON object
(``response_format: {"type": "json_object"}``: llguidance's mask applied to its row each
token), and with every other request constrained: constrained vs free decoding tok/s,
and what constrained rows cost the free rows beside them.

With ``--prefix``, rows ``<package>/nocache`` and ``/cache`` run the engine workload
with every prompt a shared ``--prefix-len``-token "system prompt" (500) followed by its
own question, with the prefix cache off and on (``prefix_cache_mb=256``): TTFT p50 / p99
and aggregate tok/s.

With ``--masks TOKENIZER_JSON``, one line per batch size: llguidance's mask for that
many constrained rows (a JSON schema with nested objects, arrays and enums, random
allowed tokens consumed) filled one row after the other, as the engine does, and with
``llguidance.numpy.fill_next_token_bitmask_par`` on an ``LLExecutor`` (its thread
pool): ms per step, the median of 3 runs of 40 steps. The engine keeps the serial fill
unless the parallel one is faster here.

With ``--burst``, rows ``<package>/whole`` and ``/chunk`` run the engine workload with
``--burst-len``-token prompts (256), each prompt prefilled whole and alone
(``prefill_chunk=0``, the old engine) and with chunked, batched prefill (the default
``--prefill-chunk``), then a line per variant with the 8-client TTFT p99 over the
1-client TTFT p50 (goal: <= 2x) and the 8-client aggregate tok/s over 1 client's (goal:
>= 3x). With 8 clients and 8 requests the 8 prompts arrive together.

With ``--ray``, the server is ``mobius serve --ray`` (a local Ray instance, started
anew for each ``--replicas`` count, default 1 and 2; ``--replica-cpus`` each), rows
``<package>/rayN``, then a line with N replicas' aggregate tok/s over 1 replica's at each
client count. On one small machine the replicas share its cores, so expect about 1x;
on a machine (or cluster) with a core set per replica, the ratio is the scaling.

Usage: python benchmarks/serve.py [--which tiny mid] [--clients 1 4 8] [--requests 8]
                                  [--new 64] [--runs 1] [--threads 2] [--max-batch 8]
                                  [--engine] [--constrained] [--prefix [--prefix-len 500]]
                                  [--masks TOKENIZER_JSON]
                                  [--burst [--burst-len 256]]
                                  [--client-threads | --both-client-modes]
                                  [--ray [--replicas 1 2] [--replica-cpus 1]]
Goal (not asserted): 8 clients >= 3x the aggregate tokens/s of one client on CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "testdata" / "tiny-gemma4"
WORK = Path("/tmp/mobius-bench")
LISTENING = re.compile(r"serving '[^']+' at (http://127\.0\.0\.1:\d+)/v1")


def package_for(which: str) -> Path:
    import mobius

    if which == "tiny":
        source = TINY
    else:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from decode import MID, make_mid_checkpoint

        source = make_mid_checkpoint(MID)
    out = WORK / f"serve-{which}-cpu"
    if not (out / "mobius.json").is_file():
        mobius.build(str(source), str(out), target="cpu", force=True)
    return out


def start_server(package: Path, threads: int, max_batch: int,
                 extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:  # fmt: skip
    code = "import sys; from mobius.cli import main; sys.exit(main())"
    args = [sys.executable, "-c", code, "serve", str(package), "--port", "0",
            "--device", "cpu", "--threads", str(threads), "--max-batch", str(max_batch),
            "--model-name", "bench", *extra]  # fmt: skip
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 300
    for line in proc.stderr:  # type: ignore[union-attr]
        m = LISTENING.search(line)
        if m:
            # keep draining the log so the server never blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit(f"the server for {package} did not start")


def one_request(http: Any, url: str, prompt: list[int], new: int) -> dict[str, float]:
    """Stream one greedy completion; times of the first and last token, token count."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": new, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    first = last = None
    tokens = 0
    with http.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"]:
                now = time.perf_counter()
                first = first or now
                last = now
    if first is None or last is None or tokens == 0:
        raise RuntimeError("a request produced no tokens")
    return {"ttft": first - start, "per_token": (last - first) / max(tokens - 1, 1),
            "tokens": tokens}  # fmt: skip


def _take(todo: Any) -> int | None:
    try:
        return todo.get_nowait()
    except queue.Empty:
        return None


def _client_loop(http: Any, url: str, prompts: list[list[int]], new: int, take: Any,
                 give: Any) -> None:  # fmt: skip
    """One client: requests taken from the shared work list until it is empty."""
    while (i := take()) is not None:
        give(one_request(http, url, prompts[i], new))


def _process_client(url: str, prompts: list[list[int]], new: int, todo: Any, out: Any,
                    ready: Any, go: Any) -> None:  # fmt: skip
    """Body of one client process: get ready (untimed), wait for the start, report back."""
    import httpx

    try:
        with httpx.Client() as http:  # one connection per client, as applications keep
            # untimed: the client's lazy imports and its connection, which the threads
            # of --client-threads share with the warm-up of the benchmark process
            http.get(url + "/health", timeout=60).raise_for_status()
            ready.put(os.getpid())
            go.wait()
            # a blocking get: multiprocessing's get_nowait() reports Empty whenever another
            # process holds the queue's read lock, which would end clients early
            give = lambda r: out.put(("ok", {**r, "pid": os.getpid()}))  # noqa: E731
            _client_loop(http, url, prompts, new, todo.get, give)
    except BaseException as exc:  # reported to the parent, which raises it
        out.put(("error", f"{type(exc).__name__}: {exc}"))
        ready.put(os.getpid())
    out.put(("end", None))


def run_row(url: str, prompts: list[list[int]], clients: int, new: int,
            mode: str = "process") -> dict[str, float]:  # fmt: skip
    """The workload with ``clients`` concurrent clients: separate processes or threads."""
    if mode == "thread":
        return _run_row_threads(url, prompts, clients, new)
    ctx = mp.get_context("spawn")  # no fork of a process that may hold ORT threads
    todo, out, ready, go = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
    for i in [*range(len(prompts)), *[None] * clients]:  # then one end mark per client
        todo.put(i)
    procs = [ctx.Process(target=_process_client, args=(url, prompts, new, todo, out, ready, go),
                         daemon=True) for _ in range(clients)]  # fmt: skip
    for p in procs:
        p.start()
    for _ in procs:  # every client has started and imported its HTTP client
        ready.get(timeout=120)
    start = time.perf_counter()
    go.set()
    results: list[dict[str, float]] = []
    errors: list[str] = []
    ended = 0
    while ended < clients:
        kind, data = out.get(timeout=600)
        if kind == "ok":
            results.append(data)
        elif kind == "error":
            errors.append(data)
        else:
            ended += 1
    wall = time.perf_counter() - start
    for p in procs:
        p.join(30)
    if errors:
        raise RuntimeError(f"a client process failed: {errors[0]}")
    busy = len({r.pop("pid") for r in results})
    if busy < min(clients, len(prompts)):
        print(f"warning: only {busy} of {clients} client processes got a request in this "
              "run (they woke late): its concurrency is lower", file=sys.stderr)  # fmt: skip
    return _summary(results, clients, wall)


def _run_row_threads(url: str, prompts: list[list[int]], clients: int,
                     new: int) -> dict[str, float]:  # fmt: skip
    """All clients as threads of this process (they share its GIL for HTTP and JSON work)."""
    results: list[dict[str, float]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(prompts)):
        todo.put(i)

    def client() -> None:
        import httpx

        try:
            with httpx.Client() as http:  # one connection per client, as applications keep
                _client_loop(http, url, prompts, new, lambda: _take(todo), results.append)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    wall = _run_threads(client, clients)
    if errors:
        raise errors[0]
    return _summary(results, clients, wall)


def _run_threads(target: Any, n: int) -> float:
    """Seconds for ``n`` threads running ``target`` together, started at once."""
    threads = [threading.Thread(target=target) for _ in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def run_engine_row(package: Path, prompts: list[list[int]], clients: int, new: int,
                   threads: int, max_batch: int, constrain: str = "none",
                   cache_mb: float = 0.0, prefill_chunk: int | None = None,
                   ) -> dict[str, float]:  # fmt: skip
    """The same workload through ``Engine`` in this process: no HTTP, no JSON, no client.

    ``constrain``: ``none``, ``all`` (every request one JSON object) or ``half``;
    ``prefill_chunk``: the engine's (None: its default).
    """
    from mobius_runtime import Pipeline
    from mobius_runtime.engine import Engine
    from mobius_runtime.sampling import SamplingParams

    global _PIPELINE
    if _PIPELINE is None or _PIPELINE[0] != package:
        _PIPELINE = (package, Pipeline.load(package, device="cpu", threads=threads))
    chunk = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
    engine = Engine(
        _PIPELINE[1], max_batch=max_batch, max_queue=len(prompts), prefix_cache_mb=cache_mb,
        **chunk,
    )  # fmt: skip
    constraint = None
    if constrain != "none":
        from mobius_runtime.constrained import Constraint
        from mobius_runtime.requests import vocab_size

        pipeline = _PIPELINE[1]
        constraint = Constraint.json_object(
            pipeline.text, vocab_size(pipeline.manifest), engine.stops
        )
    samplings = [
        SamplingParams(
            max_tokens=new,
            constraint=constraint
            if constrain == "all" or (constrain == "half" and i % 2)
            else None,
        )
        for i in range(len(prompts))
    ]
    engine.start()
    results: list[dict[str, float]] = []
    lock = threading.Lock()
    todo = list(range(len(prompts)))

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            out = _engine_request(engine, prompts[i], samplings[i])
            with lock:
                results.append(out)

    wall = _run_threads(client, clients)
    engine.stop()
    return _summary(results, clients, wall)


_PIPELINE: tuple[Path, Any] | None = None


def _engine_request(engine: Any, prompt: list[int], sampling: Any) -> dict[str, float]:
    done = threading.Event()
    times: list[float] = []
    box: dict[str, Any] = {}

    def sink(kind: str, data: Any) -> None:
        if kind == "delta":
            times.append(time.perf_counter())
        else:
            box[kind] = data
            done.set()

    engine.submit({"input_ids": np.asarray([prompt])}, sampling, sink)
    done.wait()
    if "done" not in box:
        raise RuntimeError(f"a request failed: {box}")
    n = box["done"].completion_tokens
    span = (times[-1] - times[0]) if len(times) > 1 else 0.0
    return {"ttft": box["done"].ttft_ms / 1000, "per_token": span / max(n - 1, 1), "tokens": n}


def _summary(results: list[dict[str, float]], clients: int, wall: float) -> dict[str, float]:
    ttft = sorted(r["ttft"] * 1000 for r in results)
    per_token = sorted(r["per_token"] * 1000 for r in results)
    tokens = sum(r["tokens"] for r in results)
    return {
        "clients": clients,
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "ttft_p50": statistics.median(ttft),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "tpot_p50": statistics.median(per_token),
        "tpot_p99": float(np.percentile(per_token, 99)),
    }


MASK_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
        "size": {"type": "object", "properties": {"w": {"type": "integer"}}, "required": ["w"]},
    },
    "required": ["name", "tags", "size"],
}


def mask_rows(tokenizer: Path, batches: list[int], steps: int = 40) -> None:
    """Serial vs parallel llguidance masks for ``batches`` constrained rows (see --masks)."""
    import llguidance
    import llguidance.numpy as lln

    tok = llguidance.LLTokenizer(str(tokenizer))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        MASK_SCHEMA, defaults={"whitespace_flexible": False}
    )
    compiled = llguidance.LLMatcher(tok, grammar, log_level=0)
    executor = llguidance.LLExecutor()

    def run(rows: int, parallel: bool) -> float:
        rng = np.random.default_rng(0)
        matchers = [compiled.deep_copy() for _ in range(rows)]
        bits = lln.allocate_token_bitmask(rows, tok.vocab_size)
        spent = 0.0
        for _ in range(steps):
            start = time.perf_counter()
            if parallel:
                lln.fill_next_token_bitmask_par(executor, list(zip(matchers, range(rows))), bits)
            else:
                for i, matcher in enumerate(matchers):
                    lln.fill_next_token_bitmask(matcher, bits, i)
            spent += time.perf_counter() - start
            for i, matcher in enumerate(matchers):
                row = np.unpackbits(bits[i].view(np.uint8), bitorder="little")
                allowed = np.flatnonzero(row[: tok.vocab_size])
                if allowed.size and not matcher.is_stopped():
                    matcher.consume_token(int(rng.choice(allowed)))
        return spent / steps * 1e3

    print(f"masks: {tokenizer} ({tok.vocab_size} tokens), ms per step, median of 3")
    for rows in batches:
        serial = statistics.median(run(rows, False) for _ in range(3))
        parallel = statistics.median(run(rows, True) for _ in range(3))
        print(f"  {rows} rows: serial {serial:.3f}  parallel {parallel:.3f}  "
              f"(load {load_average()})")  # fmt: skip


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--which", nargs="+", default=["tiny", "mid"], choices=["tiny", "mid"])
    ap.add_argument("--clients", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--requests", type=int, default=8, help="requests per row (all rows)")
    ap.add_argument("--new", type=int, default=64, help="max tokens per request")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--runs", type=int, default=1, help="runs per row (the median is shown)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument(
        "--engine",
        action="store_true",
        help="also run the workload through the Engine in-process (rows <package>/eng): "
        "batching without HTTP, JSON and client costs",
    )
    ap.add_argument(
        "--constrained",
        action="store_true",
        help="also run the engine workload free, constrained to JSON, and half constrained "
        "(rows <package>/free, /json, /mix)",
    )
    ap.add_argument(
        "--prefix",
        action="store_true",
        help="also run the engine workload with one shared prompt prefix, prefix cache off "
        "and on (rows <package>/nocache, /cache)",
    )
    ap.add_argument("--prefix-len", type=int, default=500, help="tokens of the shared prefix")
    ap.add_argument(
        "--masks",
        type=Path,
        metavar="TOKENIZER_JSON",
        help="only measure llguidance's mask for 1, 4 and 8 rows, serial and parallel, on "
        "this tokenizer.json",
    )
    ap.add_argument(
        "--burst", action="store_true",
        help="also run engine rows with --burst-len-token prompts prefilled whole and alone "
        "and chunked + batched (rows <package>/whole, /chunk): TTFT p99 under a burst",
    )  # fmt: skip
    ap.add_argument("--burst-len", type=int, default=256, help="prompt tokens with --burst")
    ap.add_argument(
        "--client-threads",
        action="store_true",
        help="run the HTTP clients as threads of this process (the old way: they share one "
        "GIL) instead of one process each",
    )
    ap.add_argument(
        "--both-client-modes",
        action="store_true",
        help="run the HTTP rows twice on the same server: clients as processes (<package>/proc) "
        "and as threads (<package>/thr)",
    )
    ap.add_argument(
        "--ray",
        action="store_true",
        help="serve with `mobius serve --ray` (a local Ray instance) instead, once per "
        "--replicas count (rows <package>/rayN), and print N replicas' tok/s over 1's",
    )
    ap.add_argument("--replicas", nargs="+", type=int, default=[1, 2], help="with --ray")
    ap.add_argument(
        "--replica-cpus", type=float, default=1.0, help="with --ray: Ray CPUs per replica"
    )
    args = ap.parse_args()
    if args.masks is not None:
        mask_rows(args.masks, [1, 4, 8])
        return
    if args.both_client_modes:
        modes = ["process", "thread"]
    else:
        modes = ["thread"] if args.client_threads else ["process"]

    rng = np.random.default_rng(0)
    prompts = [[2, *rng.integers(7, 500, size=args.prompt_len - 1).tolist()]
               for _ in range(args.requests)]  # fmt: skip
    print(f"load average before: {load_average()}")
    head = (f"{'package':10} {'clients':>7} {'tokens':>6} {'wall s':>7} {'tok/s':>8} "
            f"{'x 1 cl':>6} {'TTFT p50':>9} {'p99':>8} {'ms/tok p50':>10} {'p99':>7}  load")  # fmt: skip
    print(head)
    for which in args.which:
        package = package_for(which)
        if args.engine:
            engine_row = functools.partial(
                run_engine_row, package, prompts, new=args.new, threads=args.threads,
                max_batch=args.max_batch,
            )  # fmt: skip
            _rows(f"{which}/eng", args, lambda c, run=engine_row: run(clients=c))
        if args.prefix:
            shared = [2, *rng.integers(7, 500, size=args.prefix_len - 1).tolist()]
            asks = [[*shared, *rng.integers(7, 500, size=16).tolist()]
                    for _ in range(args.requests)]  # fmt: skip
            variants = [("nocache", {"cache_mb": 0.0}), ("cache", {"cache_mb": 256.0})]
            _engine_variants(which, package, asks, args, variants)
        if args.burst:
            _burst_rows(which, package, rng, args)
        if args.constrained:
            variants = [(label, {"constrain": mode})
                        for label, mode in (("free", "none"), ("json", "all"), ("mix", "half"))]  # fmt: skip
            _engine_variants(which, package, prompts, args, variants)
        if args.ray:
            _ray_rows(which, package, prompts, args)
            continue
        proc, url = start_server(package, args.threads, args.max_batch)
        try:
            _warm(url, prompts)
            for mode in modes:
                short = {"process": "proc", "thread": "thr"}[mode]
                label = which if len(modes) == 1 else f"{which}/{short}"
                run = functools.partial(run_row, url, prompts, new=args.new, mode=mode)
                _rows(label, args, run)
        finally:
            proc.terminate()
            proc.wait(30)


def _warm(url: str, prompts: list[list[int]]) -> None:
    import httpx

    with httpx.Client() as http:
        one_request(http, url, prompts[0], 4)


def _ray_rows(which: str, package: Path, prompts: list[list[int]], args: Any) -> None:
    """The workload against `mobius serve --ray` with each replica count (a fresh local Ray
    instance per count), then N replicas' aggregate tok/s over 1's at each client count."""
    by_count: dict[int, list[dict[str, float]]] = {}
    for n in args.replicas:
        extra = ("--ray", "--replicas", str(n), "--replica-cpus", str(args.replica_cpus))
        proc, url = start_server(package, args.threads, args.max_batch, extra)
        try:
            for _ in range(2):  # each replica's first request (Ray spreads the two)
                _warm(url, prompts)
            run = functools.partial(run_row, url, prompts, new=args.new, mode="process")
            by_count[n] = _rows(f"{which}/ray{n}", args, run)
        finally:
            proc.terminate()  # SIGTERM: the app is deleted, Ray shut down
            proc.wait(120)
    if 1 in by_count:
        for n, rows in by_count.items():
            if n == 1:
                continue
            ratios = ", ".join(f"{r['clients']} cl {r['tok_s'] / one['tok_s']:.2f}x"
                               for r, one in zip(rows, by_count[1], strict=True))  # fmt: skip
            print(f"{which}: {n} replicas / 1 replica (tok/s): {ratios}  load {load_average()}")


def _burst_rows(which: str, package: Path, rng: Any, args: Any) -> None:
    """``--burst``: long prompts prefilled whole and alone vs chunked and batched; then the
    TTFT p99 (most clients) / TTFT p50 (1 client) and tok/s ratios of each."""
    asks = [[2, *rng.integers(7, 500, size=args.burst_len - 1).tolist()]
            for _ in range(args.requests)]  # fmt: skip
    for label, chunk in (("whole", 0), ("chunk", None)):
        row = functools.partial(
            run_engine_row, package, asks, new=args.new, threads=args.threads,
            max_batch=args.max_batch, prefill_chunk=chunk,
        )  # fmt: skip
        rows = _rows(f"{which}/{label}", args, lambda c, run=row: run(clients=c))
        one, most = rows[0], rows[-1]
        print(f"{which}/{label}: {most['clients']} clients' TTFT p99 / 1 client's TTFT p50 "
              f"{most['ttft_p99'] / one['ttft_p50']:.2f}x (goal <= 2x), tok/s "
              f"{most['tok_s'] / one['tok_s']:.2f}x (goal >= 3x)  load {load_average()}")  # fmt: skip


def _engine_variants(which: str, package: Path, prompts: list[list[int]], args: Any,
                     variants: list[tuple[str, dict[str, Any]]]) -> None:  # fmt: skip
    """Rows ``<which>/<label>`` of the engine workload, one per (label, run_engine_row options)."""
    for label, options in variants:
        row = functools.partial(
            run_engine_row, package, prompts, new=args.new, threads=args.threads,
            max_batch=args.max_batch, **options,
        )  # fmt: skip
        _rows(f"{which}/{label}", args, lambda c, run=row: run(clients=c))


def _rows(label: str, args: Any, run: Any) -> list[dict[str, float]]:
    out = []
    base = None
    for clients in args.clients:
        rows = [run(clients) for _ in range(args.runs)]
        row = sorted(rows, key=lambda r: r["tok_s"])[len(rows) // 2]  # the median run
        out.append(row)
        base = base or row["tok_s"]
        print(
            f"{label:10} {clients:>7} {row['tokens']:>6} {row['wall_s']:>7.2f} "
            f"{row['tok_s']:>8.1f} {row['tok_s'] / base:>6.2f} "
            f"{row['ttft_p50']:>9.1f} {row['ttft_p99']:>8.1f} "
            f"{row['tpot_p50']:>10.2f} {row['tpot_p99']:>7.2f}  {load_average()}",
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()
