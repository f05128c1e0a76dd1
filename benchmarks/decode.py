"""Greedy decode speed: mobius-runtime against onnxruntime-genai and HF on the same weights.

For each checkpoint: build a package per --targets (``default``: ONNX Attention,
concat KV; ``cpu``: GroupQueryAttention with shared, preallocated KV buffers), run
greedy generation on the same prompt ids with mobius-runtime (its own thread choice
unless ``--threads``), with
onnxruntime-genai on the *same package* (its genai_config.json; run by
``benchmarks/og_decode.py`` in a subprocess of its own venv, ``--og-python``, since it
brings its own onnxruntime) and with HF transformers, assert identical ids, and print
prefill latency, decode tokens/s and the ratios. mobius-runtime and onnxruntime-genai
take turns (with ``--spin`` naming several modes, each mode's own Pipeline takes its turn
too), one generation each, ``--rounds`` × ``--runs`` times (onnxruntime-genai stays
loaded in its subprocess) and the medians are compared, so both see the same load; the load
average is printed too (the machine is shared and noisy). onnxruntime-genai's own default
is ``hardware_concurrency / 2`` intra-op threads, capped at 16 (its
``Model::CreateSessionOptionsFromConfig``: it assumes two hardware threads per core), so
on a 2-core VM without SMT it runs one thread. Checkpoints:

  (a) tiny  — testdata/tiny-gemma4 (bundled)
  (b) mid   — a random Gemma 4 text checkpoint (~400 M parameters, PLE and KV
              sharing) made with transformers from a fixed seed into /tmp

Usage: python benchmarks/decode.py [--which tiny mid] [--targets default cpu] [--threads N]
                                  [--spin auto on off (ours: one Pipeline per mode)]
                                  [--og-threads N (default: og's own session options)]
                                  [--new 64] [--runs 3] [--rounds 3] [--og-python PY] [--no-hf]
The onnxruntime-genai venv: python -m venv .venv && .venv/bin/pip install
onnxruntime-genai==0.18.0 tokenizers numpy (no onnxruntime-gpu in it).
Targets (not asserted): >= 1.0x onnxruntime-genai everywhere; >= 20x HF on (a), >= 1.5x on (b).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "testdata" / "tiny-gemma4"
MID = Path("/tmp/mobius-bench/mid-gemma4")


def make_random_gemma4(
    out: Path,
    label: str,
    seed: int = 0,
    layer_types: list[str] | None = None,
    randomize: tuple[str, ...] = (),
    **overrides: Any,
) -> Path:
    """A seeded random Gemma 4 text checkpoint: the tiny config with ``overrides`` (made
    with transformers, reused when ``out`` already holds one). Without ``layer_types`` the
    hub-style default layer pattern applies (per_layer_config would win, so it is dropped).
    Parameters whose names end with one of ``randomize`` (HF initialises them to ones) get
    uniform values in [0.5, 1.5)."""
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads((TINY / "config.json").read_text())
    raw.update(overrides)
    raw.pop("per_layer_config", None)
    if layer_types is None:
        raw.pop("layer_types", None)
    else:
        raw["layer_types"] = layer_types
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(raw))
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if randomize:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(randomize):
                    p.uniform_(0.5, 1.5)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (TINY / name).is_file():
            (out / name).write_bytes((TINY / name).read_bytes())
    n = sum(p.numel() for p in model.parameters())
    print(f"{label} checkpoint: {n / 1e6:.0f} M parameters at {out}")
    return out


def make_mid_checkpoint(out: Path, seed: int = 0) -> Path:
    """A seeded random Gemma 4 text checkpoint of about 400 M parameters."""
    return make_random_gemma4(
        out,
        "mid",
        seed,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        global_head_dim=256,
        vocab_size=32768,
        hidden_size_per_layer_input=128,
        vocab_size_per_layer_input=32768,
        num_kv_shared_layers=4,
    )


def build(source: Path, out: Path, target: str) -> Path:
    import mobius

    mobius.build(str(source), str(out), target=target, force=True)
    return out


class OgProcess:
    """onnxruntime-genai in its own venv (``og_decode.py``), one generation per request."""

    def __init__(
        self, python: str, package: Path, ids: list[int], new: int, threads: int | None
    ) -> None:
        script = Path(__file__).with_name("og_decode.py")
        cmd = [python, str(script), str(package), "--ids", ",".join(map(str, ids))]
        cmd += ["--new", str(new)] + ([] if threads is None else ["--threads", str(threads)])
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.versions = self._read().get("versions", "?")  # once loaded and warmed up

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"onnxruntime-genai failed:\n{self.proc.stderr.read()[-2000:]}")
        return json.loads(line)

    def generate(self) -> tuple[list[int], float, float]:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        data = self._read()
        return data["ids"], data["prefill_ms"], data["decode_tokens_per_s"]

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def side_by_side(package: Path, ids, args) -> tuple:
    """mobius-runtime (one Pipeline per ``--spin`` mode) and onnxruntime-genai, one
    generation each in turn, rounds × runs times.

    Alternating single generations (not blocks) gives every side the same machine load;
    the medians of each side's generations are compared. Returns
    ``(ours, og)``: ``ours`` maps each spin mode to ``(ids, prefill ms, tok/s, KV note,
    spin decided, threads)``; ``og`` is ``(ids, prefill ms, tok/s)`` or None.
    """
    from mobius_runtime import Pipeline

    pipelines = {}
    for mode in args.spin:
        p = Pipeline.load(package, device="cpu", threads=args.threads, spin=mode)
        p.generate(input_ids=ids, max_new_tokens=4, stop_ids=())  # warm-up
        pipelines[mode] = p
    og = (
        OgProcess(args.og_python, package, ids, args.new, args.og_threads)
        if args.og_python
        else None
    )
    ours: dict[str, list] = {mode: [] for mode in pipelines}
    theirs = []
    try:
        for _ in range(args.rounds * args.runs):
            for mode, p in pipelines.items():
                r = p.generate(input_ids=ids, max_new_tokens=args.new, stop_ids=())
                ours[mode].append((r.ids, r.prefill_ms, r.decode_tokens_per_s))
            if og is not None:
                theirs.append(og.generate())
    finally:
        if og is not None:
            og.close()
    if og is not None:
        global OG_VERSIONS
        OG_VERSIONS = og.versions
    summary = {}
    for mode, runs in ours.items():
        for m in runs[1:]:
            assert m[0] == runs[0][0], "mobius-runtime is not deterministic"
        p = pipelines[mode]
        shared = ", ".join(f"{c}: {'shared' if on else 'concat'}" for c, on in p.kv_sharing.items())
        summary[mode] = (
            runs[0][0],
            statistics.median(m[1] for m in runs),
            statistics.median(m[2] for m in runs),
            shared,
            p.spin,
            p.threads,
        )
    og_summary = None
    if theirs:
        og_summary = (
            theirs[0][0],
            statistics.median(t[1] for t in theirs),
            statistics.median(t[2] for t in theirs),
        )
    return summary, og_summary


def bench_hf(source: Path, ids: list[int], new: int, threads: int, runs: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    x = torch.tensor([ids])
    kw = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
    with torch.inference_mode():
        model.generate(x, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
        prefill, rates, out = [], [], None
        for _ in range(runs):
            t0 = time.perf_counter()
            model(x)
            prefill.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            out = model.generate(x, **kw)
            total = time.perf_counter() - t0
            rates.append((new - 1) / max(total - prefill[-1] / 1000, 1e-9))
    return out[0, len(ids) :].tolist(), statistics.median(prefill), statistics.median(rates)


OG_VERSIONS = "not run"
"""onnxruntime-genai's versions as its subprocess reported them (set by side_by_side)."""


def versions() -> str:
    import importlib.metadata as md

    import onnxruntime

    ours = ", ".join(f"{d} {md.version(d)}" for d in ("mobius-core", "mobius-runtime"))
    return f"ours: {ours}, onnxruntime {onnxruntime.__version__}; og: {OG_VERSIONS}"


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} (1 / 5 min) on {os.cpu_count()} cores"


def threads_note(args: argparse.Namespace) -> str:
    """How many intra-op threads ours ran (the runtime's own choice unless --threads)."""
    if args.threads:
        return f"{args.threads} threads"
    return "threads as the runtime chose (see each line)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--which", nargs="+", default=["tiny", "mid"], choices=["tiny", "mid"])
    ap.add_argument("--targets", nargs="+", default=["default", "cpu"], choices=["default", "cpu"])
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="ours: intra-op threads (default: the runtime's own choice, decide_threads); "
        "HF: torch threads (default 2)",
    )
    ap.add_argument(
        "--og-threads",
        type=int,
        default=None,
        help="onnxruntime-genai's intra-op threads (default: its own session options)",
    )
    ap.add_argument(
        "--spin",
        nargs="+",
        default=["auto"],
        choices=["auto", "on", "off"],
        help="ours: Pipeline.load(spin=) per mode, each its own Pipeline, in turns with og",
    )
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--rounds", type=int, default=3, help="with --runs: generations per side, taken in turns"
    )
    default_og = ROOT / ".venv" / "bin" / "python"
    ap.add_argument(
        "--og-python",
        default=str(default_og) if default_og.is_file() else None,
        help="python of a venv with onnxruntime-genai (default: .venv/bin/python if present)",
    )
    ap.add_argument("--no-hf", action="store_true", help="skip HF transformers (needs torch)")
    ap.add_argument("--package", type=Path, help="prebuilt package for one --which / --targets")
    ap.add_argument("--no-build", action="store_true", help="reuse /tmp/mobius-bench packages")
    args = ap.parse_args()
    print(f"start: {load_average()}")
    for which in args.which:
        source = TINY if which == "tiny" else make_mid_checkpoint(MID)
        ids = [2, *np.random.default_rng(0).integers(10, 300, args.prompt_len - 1).tolist()]
        rows = []
        for target in args.targets:
            package = args.package or Path(f"/tmp/mobius-bench/{which}-{target}-pkg")
            if not args.package and not (args.no_build and (package / "mobius.json").is_file()):
                build(source, package, target)
            rows.append((target, *side_by_side(package, ids, args)))
        hf_threads = args.threads or 2
        hf = None if args.no_hf else bench_hf(source, ids, args.new, hf_threads, args.runs)
        print(
            f"{which}: prompt {len(ids)}, {args.new} new tokens, ours {threads_note(args)}, "
            f"median of {args.rounds * args.runs} alternating generations; {load_average()}"
        )
        for target, ours, og in rows:
            for mode, (m_ids, m_pre, m_tps, shared, spun, n) in ours.items():
                count = f"{n} thread{'s' * (n != 1)}" if n else "onnxruntime's default threads"
                line = (
                    f"  mobius-runtime     --target {target:7s} --spin {mode:4s} "
                    f"({'spins' if spun else 'no spin'}; {count}; {shared}): "
                    f"prefill {m_pre:8.2f} ms, "
                    f"decode {m_tps:9.1f} tok/s"
                )
                if og is not None:
                    assert m_ids == og[0], (
                        f"{which}/{target}: ids differ\n ours {m_ids}\n og {og[0]}"
                    )
                    line += f", {m_tps / og[2]:5.2f}x onnxruntime-genai"
                if hf is not None:
                    assert m_ids == hf[0], (
                        f"{which}/{target}: ids differ\n ours {m_ids}\n hf {hf[0]}"
                    )
                    line += f", {m_tps / hf[2]:6.1f}x HF"
                print(line)
            if og is not None:
                print(
                    f"  onnxruntime-genai  --target {target:7s} (same package):  prefill "
                    f"{og[1]:8.2f} ms, decode {og[2]:9.1f} tok/s"
                )
        if hf is not None:
            print(
                f"  HF transformers generate():  prefill {hf[1]:8.2f} ms, decode {hf[2]:9.1f} tok/s"
            )
        print("  identical greedy ids: yes")
        print(f"  {versions()}")


if __name__ == "__main__":
    main()
