"""Greedy decode speed: mobius-runtime against HF transformers generate() on the same weights.

For each checkpoint: build the package (or take --package), run greedy generation
with both on the same prompt ids and thread count, assert identical ids, and
print prefill latency, decode tokens/s and the mobius/HF ratio (median of
--runs runs). Checkpoints:

  (a) tiny  — testdata/tiny-gemma4 (bundled)
  (b) mid   — a random Gemma 4 text checkpoint (~400 M parameters, PLE and KV
              sharing) made with transformers from a fixed seed into /tmp

Usage: python benchmarks/decode.py [--which tiny mid] [--threads 2] [--new 64] [--runs 3]
Targets (not asserted): >= 20x HF on (a), >= 1.5x on (b).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "testdata" / "tiny-gemma4"
MID = Path("/tmp/mobius-bench/mid-gemma4")


def make_mid_checkpoint(out: Path, seed: int = 0) -> Path:
    """A seeded random Gemma 4 text checkpoint of about 400 M parameters."""
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads((TINY / "config.json").read_text())
    raw.update(
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
    raw.pop("layer_types", None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(raw))
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (TINY / name).is_file():
            (out / name).write_bytes((TINY / name).read_bytes())
    n = sum(p.numel() for p in model.parameters())
    print(f"mid checkpoint: {n / 1e6:.0f} M parameters at {out}")
    return out


def build(source: Path, out: Path) -> Path:
    import mobius

    mobius.build(str(source), str(out), force=True)
    return out


def bench_mobius(package: Path, ids: list[int], new: int, threads: int, runs: int):
    from mobius_runtime import Pipeline

    p = Pipeline.load(package, device="cpu", threads=threads)
    p.generate(input_ids=ids, max_new_tokens=4, stop_ids=())  # warm-up
    results = [p.generate(input_ids=ids, max_new_tokens=new, stop_ids=()) for _ in range(runs)]
    return (
        results[0].ids,
        statistics.median(r.prefill_ms for r in results),
        statistics.median(r.decode_tokens_per_s for r in results),
    )


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--which", nargs="+", default=["tiny", "mid"], choices=["tiny", "mid"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--package", type=Path, help="prebuilt package for a single --which")
    args = ap.parse_args()
    for which in args.which:
        source = TINY if which == "tiny" else make_mid_checkpoint(MID)
        package = args.package or build(source, Path(f"/tmp/mobius-bench/{which}-pkg"))
        ids = [2, *np.random.default_rng(0).integers(10, 300, args.prompt_len - 1).tolist()]
        m_ids, m_pre, m_tps = bench_mobius(package, ids, args.new, args.threads, args.runs)
        h_ids, h_pre, h_tps = bench_hf(source, ids, args.new, args.threads, args.runs)
        assert m_ids == h_ids, f"{which}: ids differ\n mobius {m_ids}\n hf     {h_ids}"
        print(
            f"{which}: prompt {len(ids)}, {args.new} new tokens, {args.threads} threads, "
            f"median of {args.runs}\n"
            f"  mobius-runtime: prefill {m_pre:8.2f} ms, decode {m_tps:9.1f} tok/s\n"
            f"  HF transformers: prefill {h_pre:8.2f} ms, decode {h_tps:9.1f} tok/s\n"
            f"  ratio (decode tok/s): {m_tps / h_tps:.1f}x   identical ids: yes"
        )


if __name__ == "__main__":
    main()
