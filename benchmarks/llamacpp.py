"""mobius-runtime against llama.cpp on the same GGUF file: prefill time, decode tok/s, ids.

For each GGUF file: ``mobius build FILE OUT --target cpu`` (plus any ``--build-args``,
e.g. ``"--quant int4"``), then, in this one process, mobius-runtime (``Pipeline.load(...,
threads=2)``, ``generate``) and llama.cpp through llama-cpp-python's low-level calls
(``Llama.eval`` on the prompt, then one ``eval`` per token, the next id the argmax of the
last logits row: llama-cpp-python's high-level ``generate()`` samples in Python over the
whole vocabulary, which is not llama.cpp's speed) take turns, one greedy generation each,
``--runs`` times, on the same prompt ids (``--prompt-len`` ids of a fixed English text as
llama.cpp tokenizes it, BOS first) and the same thread count. Printed: the medians of each
side (prefill: the prompt in and the first id chosen; decode: each later id, per token),
the ratios (decode ours / llama.cpp, prefill llama.cpp / ours: >= 1.0 means we are at
least as fast), the load average before and after, both sides' versions and whether the
greedy ids agree; where they part, the token index and each side's top-2 logit margin
there, both sides fed the same ids up to that point (a small margin: a near tie that
8-bit activations on either side may flip).

Also printed: the weight bytes each side reads per decode token (every weight but the
rows a lookup gathers: ours from the package's graphs, llama.cpp from the GGUF's tensors;
a tied embedding is read whole as the output projection) and the decode speed per byte
read (decode ratio times bytes ratio). Decode at batch 1 streams every weight once per
token, so where the exact onnxruntime form of a GGUF type takes more bits than the type
itself (e.g. Q5_0 as 8-bit blocks), the bytes ratio is the decode bar's floor.

llama-cpp-python is never a dependency of the repository nor installed in CI; build it in
a benchmark venv of its own (see benchmarks/README.md): the native build enables AMX and
segfaults in llama_decode on some VMs.

With ``--hf-python PY`` (the python of a venv with torch, transformers, gguf and
accelerate) the reference runs too: HF transformers' own GGUF loader, the file dequantized
to float32 (``benchmarks/hf_gguf_greedy.py``, in a subprocess), greedy from the same
prompt ids. Printed: for how many tokens each side agrees with it and, where ours and
llama.cpp part, which id the reference chose there and its own top-2 margin. Both runtimes
round activations to 8 bits on their quantized matmuls; the reference does not.

Usage: python benchmarks/llamacpp.py FILE.gguf [FILE.gguf ...] [--build-args "--quant int4"]
           [--threads 2] [--prompt-len 128] [--new 64] [--runs 5] [--out /tmp/mobius-llamacpp]
           [--package PKG]   (a prebuilt package for a single FILE: no build) [--spin auto|on|off]
           [--hf-python PY]
Targets (not asserted): decode ours / llama.cpp >= 1.0; prefill llama.cpp / ours >= 1.0.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TEXT = (
    "The history of the lighthouse is a history of coasts, storms and the people who kept "
    "the lamps burning. Early towers burned wood or coal in open braziers; later ones used "
    "oil lamps with polished reflectors, and in the nineteenth century the Fresnel lens "
    "gathered the light of a single flame into a beam that could be seen for twenty miles. "
    "Keepers lived at the foot of the tower with their families, trimming wicks, winding the "
    "clockwork that turned the lens, and writing the weather in a logbook every few hours. "
    "On remote rocks the supply boat came once a fortnight when the sea allowed it, and in "
    "winter it often did not. Today most lights are automatic, watched from a distant "
    "control room, and many of the old towers have become museums where visitors climb the "
    "narrow stairs to the lantern room and look out over the water the keepers watched."
)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min) on {os.cpu_count()} cores"


def build(gguf: Path, out: Path, extra: list[str]) -> Path:
    """``mobius build GGUF OUT --target cpu EXTRA`` (the CLI a user runs), timed."""
    mobius = Path(sys.executable).with_name("mobius")
    cmd = [str(mobius), "build", str(gguf), str(out), "--target", "cpu", *extra, "--force"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print(f"  built: {shlex.join(cmd)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


class Ours:
    """mobius-runtime on the package: greedy ``generate`` and one-step logits."""

    def __init__(self, package: Path, threads: int, spin: str = "auto") -> None:
        from mobius_runtime import Pipeline

        self.pipeline = Pipeline.load(package, device="cpu", threads=threads, spin=spin)

    def generate(self, ids: list[int], new: int) -> tuple[list[int], float, float]:
        r = self.pipeline.generate(input_ids=[ids], max_new_tokens=new, stop_ids=())
        return r.ids, r.prefill_ms, r.decode_tokens_per_s

    def last_logits(self, ids: list[int]) -> np.ndarray:
        out, _ = self.pipeline.step(input_ids=np.asarray([ids], dtype=np.int64))
        return out["logits"][0, -1]


class LlamaCpp:
    """llama.cpp through llama-cpp-python: ``eval`` and argmax of its last logits row."""

    def __init__(self, gguf: Path, threads: int, context: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(gguf),
            n_ctx=context,
            n_batch=context,
            n_ubatch=context,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=False,
            verbose=False,
        )

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=True, special=False)

    def _last(self) -> np.ndarray:
        """The last evaluated position's logits, read in place (``llama_get_logits_ith``:
        ``eval`` keeps no copy unless ``logits_all``)."""
        import llama_cpp

        ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),))

    def generate(self, ids: list[int], new: int) -> tuple[list[int], float, float]:
        llm = self.llm
        llm.reset()  # n_tokens = 0: the next eval drops the cached positions
        t0 = time.perf_counter()
        llm.eval(ids)
        out = [int(np.argmax(self._last()))]
        t1 = time.perf_counter()
        while len(out) < new:
            llm.eval([out[-1]])
            out.append(int(np.argmax(self._last())))
        t2 = time.perf_counter()
        return out, (t1 - t0) * 1000.0, (len(out) - 1) / max(t2 - t1, 1e-9)

    def last_logits(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self._last(), dtype=np.float32)


GATHERS = {"Gather", "GatherBlockQuantized"}
"""Ops that read one row of a table per token: of their inputs only the indices (input 1)
are read whole; the data and GatherBlockQuantized's scales and zero points (inputs 0, 2,
3) are read a row at a time."""


def package_weight_bytes(package: Path) -> int:
    """Bytes of the initializers a decode step of ``package`` reads: those of every graph
    under it, less the tables (data, scales, zero points) only a lookup (:data:`GATHERS`)
    reads."""
    import onnx

    total = 0
    for path in sorted(package.rglob("*.onnx")):
        graph = onnx.load(str(path), load_external_data=False).graph
        streamed: set[str] = set()
        for node in graph.node:
            lookup = node.op_type in GATHERS
            streamed.update(x for i, x in enumerate(node.input) if not lookup or i == 1)
        for init in graph.initializer:
            if init.name in streamed:
                item = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
                total += int(np.prod(init.dims, dtype=np.int64)) * item
    return total


def gguf_weight_bytes(gguf: Path) -> int:
    """Bytes of the GGUF's tensors llama.cpp reads per decode token: all but the
    ``*token_embd*`` lookup tables, ``token_embd.weight`` included when it is also the
    output projection (no ``output.weight``)."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(gguf).tensors}
    tied = "output.weight" not in tensors
    return sum(
        n
        for name, n in tensors.items()
        if "token_embd" not in name or (tied and name == "token_embd.weight")
    )


def agreed(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def hf_reference(python: str, gguf: Path, ids: list[int], new: int, threads: int) -> dict:
    """``hf_gguf_greedy.py`` in ``python``'s venv: ``{"ids", "margins", "versions"}``."""
    script = Path(__file__).with_name("hf_gguf_greedy.py")
    cmd = [python, str(script), str(gguf), "--ids", ",".join(map(str, ids)), "--new", str(new)]
    cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"the HF reference ({' '.join(cmd[:3])}) failed:\n{tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def reference_lines(ref: dict, ours: list[int], theirs: list[int]) -> list[str]:
    """What the HF reference says about the two sides' greedy ids."""
    hf = ref["ids"]
    v = ref["versions"]
    lines = [
        f"HF reference (transformers {v['transformers']}, torch {v['torch']}, the GGUF "
        f"dequantized to float32): ours equal for the first {agreed(ours, hf)} of {len(hf)}, "
        f"llama.cpp for the first {agreed(theirs, hf)}"
    ]
    part = agreed(ours, theirs)
    # only where both sides still follow the reference up to the parting token
    followed = min(agreed(ours, hf), agreed(theirs, hf)) >= part
    if part < min(len(ours), len(theirs), len(hf)) and followed:
        chose = {ours[part]: "ours", theirs[part]: "llama.cpp"}.get(hf[part], "neither")
        lines.append(
            f"at token {part}, where ours and llama.cpp part, the reference chose "
            f"{hf[part]} ({chose}'s), its top-2 margin {ref['margins'][part]:.4f}"
        )
    return lines


def margin(logits: np.ndarray) -> str:
    top = np.argsort(logits)[::-1][:2]
    return (
        f"top-2 {int(top[0])} / {int(top[1])}, margin {float(logits[top[0]] - logits[top[1]]):.4f}"
    )


VECTOR_UNITS = {
    "avx2": "AVX2",
    "fma": "FMA",
    "f16c": "F16C",
    "avx512f": "AVX512",
    "avx512vbmi": "AVX512_VBMI",
    "avx512_vnni": "AVX512_VNNI",
    "avx512_bf16": "AVX512_BF16",
    "avx_vnni": "AVX_VNNI",
}
"""``/proc/cpuinfo`` flag -> the name llama.cpp's system info gives the same unit (``NAME =
1`` when its CPU backend was compiled with it)."""


def missing_units(system_info: str, cpuinfo: str) -> list[str]:
    """The vector units this CPU has that the llama.cpp build was compiled without (its
    kernels then run slower than the same llama.cpp built natively, as its users build it)."""
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    built = {part.split("=")[0].strip() for part in system_info.split("|") if "= 1" in part}
    built = {name.split(":")[-1].strip() for name in built}
    return [unit for flag, unit in VECTOR_UNITS.items() if flag in flags and unit not in built]


def check_build() -> str:
    """A warning line when llama.cpp lacks vector units this CPU has, else ''."""
    import llama_cpp

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    missing = missing_units(llama_cpp.llama_print_system_info().decode(), cpuinfo)
    if not missing:
        return ""
    flags = " ".join(f"-DGGML_{unit}=ON" for unit in missing)
    return (
        f"WARNING: this CPU has {', '.join(missing)} and this llama.cpp build lacks them, so "
        f"its figures understate llama.cpp: rebuild llama-cpp-python with {flags} "
        "(benchmarks/README.md, llama.cpp section)"
    )


def versions() -> str:
    import llama_cpp
    import onnxruntime

    ours = ", ".join(f"{d} {md.version(d)}" for d in ("mobius-core", "mobius-runtime"))
    return (
        f"ours: {ours}, onnxruntime {onnxruntime.__version__}; "
        f"llama.cpp: llama-cpp-python {llama_cpp.__version__} "
        f"(system info: {llama_cpp.llama_print_system_info().decode().strip()})"
    )


def bench(gguf: Path, package: Path, args) -> None:
    context = args.prompt_len + args.new + 8
    theirs = LlamaCpp(gguf, args.threads, context)
    ids = theirs.tokenize(" ".join([TEXT] * 4))[: args.prompt_len]
    if len(ids) < args.prompt_len:
        raise SystemExit(f"the text gives only {len(ids)} ids; lower --prompt-len")
    ours = Ours(package, args.threads, args.spin)
    ours.generate(ids, 4)  # warm-up, both sides
    theirs.generate(ids, 4)
    print(f"  loaded and warmed up; load average {load_average()}", flush=True)
    before = load_average()
    rows: dict[str, list] = {"ours": [], "llama.cpp": []}
    for turn in range(args.runs):  # in turns, so that both see the same load
        for name, side in (("ours", ours), ("llama.cpp", theirs)):
            rows[name].append(side.generate(ids, args.new))
            _, pre, tps = rows[name][-1]
            # each turn as it ends: a run cut short on a loaded machine still says something
            print(f"  turn {turn + 1} {name:10s} prefill {pre:8.1f} ms   decode {tps:7.1f} tok/s"
                  f"   load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    after = load_average()
    for name, runs in rows.items():
        if any(r[0] != runs[0][0] for r in runs):
            print(f"  WARNING: {name} is not deterministic over its runs")
    med = {
        name: (statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs))
        for name, runs in rows.items()
    }
    print(
        f"{gguf.name}: prompt {len(ids)} ids, {args.new} greedy tokens, {args.threads} threads, "
        f"median of {args.runs} turns each; load average before {before}, after {after}; "
        f"ours --spin {args.spin}: onnxruntime workers "
        f"{'spin' if ours.pipeline.spin else 'do not spin'}"
    )
    for name, (pre, tps) in med.items():
        print(f"  {name:10s} prefill {pre:8.1f} ms   decode {tps:7.1f} tok/s")
    (o_pre, o_tps), (l_pre, l_tps) = med["ours"], med["llama.cpp"]
    print(
        f"  decode ours / llama.cpp {o_tps / l_tps:.2f}x; prefill llama.cpp / ours {l_pre / o_pre:.2f}x"
    )
    warning = check_build()
    if warning:  # beside the ratios it invalidates
        print(f"  {warning}")
    o_bytes, l_bytes = package_weight_bytes(package), gguf_weight_bytes(gguf)
    print(
        f"  weights read per decode token: ours {o_bytes / 2**20:.1f} MiB, llama.cpp "
        f"{l_bytes / 2**20:.1f} MiB ({o_bytes / l_bytes:.2f}x); decode per byte read, ours / "
        f"llama.cpp {o_tps / l_tps * o_bytes / l_bytes:.2f}x"
    )
    a, b = rows["ours"][0][0], rows["llama.cpp"][0][0]
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    if same is None:
        print(f"  greedy ids: all {len(a)} equal")
    else:
        prefix = ids + a[:same]
        print(
            f"  greedy ids: equal for the first {same} of {len(a)}; at token {same} ours "
            f"{a[same]} ({margin(ours.last_logits(prefix))}), llama.cpp {b[same]} "
            f"({margin(theirs.last_logits(prefix))})"
        )
    print(f"  ours      {a[:24]}\n  llama.cpp {b[:24]}")
    if args.hf_python:
        ref = hf_reference(args.hf_python, gguf, ids, args.new, args.threads)
        for line in reference_lines(ref, a, b):
            print(f"  {line}")
        print(f"  reference {ref['ids'][:24]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", nargs="+", type=Path)
    ap.add_argument(
        "--build-args", default="", help='extra `mobius build` flags, e.g. "--quant int4"'
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("/tmp/mobius-llamacpp"))
    ap.add_argument("--package", type=Path, help="a prebuilt package (one GGUF file only)")
    ap.add_argument(
        "--spin", default="auto", choices=["auto", "on", "off"], help="ours: Pipeline.load(spin=)"
    )
    ap.add_argument(
        "--hf-python",
        help="python of a venv with torch, transformers, gguf and accelerate: also run HF's "
        "GGUF loader (float32) as the reference for the greedy ids",
    )
    args = ap.parse_args()
    if args.package and len(args.gguf) != 1:
        ap.error("--package goes with exactly one GGUF file")
    print(versions())
    warning = check_build()
    if warning:
        print(warning, flush=True)
    extra = shlex.split(args.build_args)
    for gguf in args.gguf:
        package = args.package
        if package is None:
            tag = "-".join(a.lstrip("-") for a in extra) or "default"
            package = build(gguf, args.out / f"{gguf.stem}-cpu-{tag}", extra)
        bench(gguf, package, args)


if __name__ == "__main__":
    main()
