"""Build benchmarks: graph-only build time / peak RSS, and a synthetic full-size E2B build.

    python benchmarks/build.py                       # (a) every full-size config, graph only
    python benchmarks/build.py --synthetic-e2b DIR   # (b) also: ~10 GB bf16 E2B in DIR, built

Numbers are printed, never asserted (a shared machine makes timings noisy).

(a) For each full-size ``config.json`` in the fixtures folder (``tiny-*`` skipped),
a fresh interpreter builds every component of the pipeline contract with the
installed plugins (read_config → pipeline_contract → build_component →
optimize_component; no weights are bound) and reports its wall time and peak RSS
(VmHWM of that process), per component and in total.

(b) ``--synthetic-e2b DIR`` writes a synthetic E2B checkpoint in bfloat16 (real
tensor names and shapes from transformers on the meta device, plus the unused
KV-consumer ``k_proj``/``v_proj``/``k_norm`` tensors the real checkpoint carries;
finite random bf16 values from a tiled random block; ``--values normal`` for N(0, 0.02)
weights and fixed norms, whose logits have margins) straight to sharded
safetensors with numpy, plus a synthetic 262,144-id tokenizer that llama.cpp's converter
accepts (:func:`write_synthetic_tokenizer`), then times ``cp -r`` of it and ``mobius.build(...,
dtype="bf16")`` on the same disk in the same run, both followed by ``sync``. It
prints peak RSS of the build (target ≤ 2 GiB) and the wall-time ratio build /
copy. Needs ~30 GB free in DIR (checked first) and torch + transformers for the
names; removes what it wrote unless ``--keep`` (a later ``--keep`` run reuses the kept
checkpoint). ``--profile FILE`` writes cProfile stats of the build.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "testdata" / "configs"
SHARD_BYTES = 2 * 1024**3
GiB = 1024**3

# One child per measured build; its peak is VmHWM, the high-water mark of its own address
# space. Not ru_maxrss: Linux carries that across exec from the address space the child
# started in, which under vfork / posix_spawn (what subprocess uses) is this parent's.
PEAK_RSS = r"""
def _peak_rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

GRAPH_CHILD = r"""
import json, resource, sys, time, traceback
t0 = time.perf_counter()
from mobius.config import read_config_file
from mobius.plugins import PluginHost
from mobius.records import BuildOptions
folder, dtype, target = sys.argv[1:4]
host = PluginHost.load()
model_type, raw = read_config_file(folder)
options = BuildOptions(dtype=dtype, target=target)
config = host.read_config(model_type, raw)
contract = host.pipeline_contract(model_type, config, options)
t_setup = time.perf_counter() - t0
parts = {}
for comp in contract.components:
    t = time.perf_counter()
    try:
        model = host.build_component(model_type, config, comp.name, options)
        model = host.optimize_component(model, comp.name, options.target)
        g = model.graph
        parts[comp.name] = {"seconds": time.perf_counter() - t, "nodes": len(g),
                            "initializers": len(g.initializers)}
    except Exception as exc:
        parts[comp.name] = {"seconds": time.perf_counter() - t,
                            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
print(json.dumps({"model_type": model_type, "setup_s": t_setup, "components": parts,
                  "wall_s": time.perf_counter() - t0,
                  "peak_rss": _peak_rss()}))
"""

BUILD_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import mobius
src, out, dtype, profile = sys.argv[1:5]
try:
    if profile:
        import cProfile
        with cProfile.Profile() as prof:
            r = mobius.build(src, out, dtype=dtype, force=True)
        prof.dump_stats(profile)
    else:
        r = mobius.build(src, out, dtype=dtype, force=True)
    info = {"components": dict(r.components), "n_tensors": r.n_tensors, "unused": len(r.unused)}
except Exception as exc:
    info = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
import os
os.sync()
info.update(wall_s=time.perf_counter() - t0,
            peak_rss=_peak_rss())
print(json.dumps(info))
"""


def _child(code: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PEAK_RSS + code, *args], capture_output=True, text=True, check=False
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def graph_only(dtype: str, target: str, configs: Path) -> None:
    """(a) Graph-only build of every full-size config, one fresh process each."""
    print(f"(a) graph-only builds, dtype {dtype}, target {target}")
    print(f"{'config':<28}{'wall s':>8}{'setup s':>9}{'peak RSS':>11}  components")
    for path in sorted(configs.glob("*.json")):
        if path.name.startswith("tiny-"):
            continue
        with _config_folder(path) as folder:
            res = _child(GRAPH_CHILD, str(folder), dtype, target)
        if "error" in res:
            print(f"{path.stem:<28}  ERROR {res['error']}")
            continue
        comps = ", ".join(
            f"{n} {c['seconds']:.1f}s/{c['nodes']}n"
            if "error" not in c
            else f"{n} ERROR {c['error']}"
            for n, c in res["components"].items()
        )
        print(
            f"{path.stem:<28}{res['wall_s']:>8.1f}{res['setup_s']:>9.1f}"
            f"{res['peak_rss'] / 2**20:>8.0f} MiB  {comps}"
        )


class _config_folder:
    """A temporary folder holding only ``config.json`` (a weightless checkpoint)."""

    def __init__(self, config: Path) -> None:
        self.config = config

    def __enter__(self) -> Path:
        import tempfile

        self.tmp = tempfile.TemporaryDirectory(prefix="mobius-bench-")
        shutil.copy(self.config, Path(self.tmp.name) / "config.json")
        return Path(self.tmp.name)

    def __exit__(self, *exc: object) -> None:
        self.tmp.cleanup()


# ---------------------------------------------------------------- (b) synthetic E2B


def e2b_tensor_shapes(config_path: Path) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names and shapes of E2B: HF model on the meta device + real quirks."""
    import torch
    from transformers.models.gemma4 import Gemma4Config, Gemma4ForConditionalGeneration

    raw = json.loads(config_path.read_text())
    config = Gemma4Config(**{k: v for k, v in raw.items() if k != "model_type"})
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(config)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    shapes = {n: s for n, s in shapes.items() if not n.startswith("lm_head.")}  # tied
    # The real E2B checkpoint also carries k/v projections for the KV-consumer layers.
    text = raw["text_config"]
    n_layers = text["num_hidden_layers"]
    hidden = text["hidden_size"]
    for i in range(n_layers - text.get("num_kv_shared_layers", 0), n_layers):
        full = text["layer_types"][i] == "full_attention"
        hd = text.get("global_head_dim", 512) if full else text["head_dim"]
        kv = text["num_key_value_heads"] * hd
        base = f"model.language_model.layers.{i}.self_attn."
        shapes.setdefault(base + "k_proj.weight", (kv, hidden))
        shapes.setdefault(base + "v_proj.weight", (kv, hidden))
        shapes.setdefault(base + "k_norm.weight", (hd,))
    return shapes


def _random_bf16_block(n_values: int):
    """Finite random bf16 bit patterns: random sign and mantissa, exponents near 2^-7."""
    import numpy as np

    bits = np.random.default_rng(0).integers(0, 2**16, size=n_values, dtype=np.uint16)
    return (bits & np.uint16(0x807F)) | np.uint16(0x3C00)


def _normal_bf16_block(n_values: int, std: float = 0.02):
    """bf16 bit patterns of N(0, std) values (float32 rounded to nearest even)."""
    import numpy as np

    f = (np.random.default_rng(0).standard_normal(n_values, np.float32) * np.float32(std)).view(
        np.uint32
    )
    return ((f + np.uint32(0x7FFF) + ((f >> 16) & 1)) >> 16).astype(np.uint16)


VALUES = ("bits", "normal")
"""What :func:`write_synthetic_checkpoint` fills the tensors with. ``bits``: random bf16
bit patterns with exponents near 2^-7 everywhere, norm weights and layer scalars included
(fast to write; since Gemma 4 multiplies by its norm weights as they are, the stream
shrinks at every norm and the logits come out flat, within 0.01 of each other, so two
runtimes' greedy ids are ties broken by rounding). ``normal``: N(0, 0.02) weights (HF's
``initializer_range``), 1.0 in every other ``*norm.weight`` and ``layer_scalar`` (HF's own
initial values) and 0.25 in the q / k norms, so that the logits spread and have top-2
margins to compare ids by. Why 0.25: Gemma 4 scales attention scores by 1.0 and relies on
its q / k norms, so unit norm weights give scores of standard deviation √head_dim = 16,
a near one-hot softmax, and a chaotic random network: on E2B built from llama.cpp's Q4_0
file, our int8-activation and float32-activation forms of the same weights gave last
logits correlated 0.59 and different top ids. With 0.25 (scores of deviation ~1) the two
forms and llama.cpp correlate 0.9996 and share their top 5 (benchmarks/README.md)."""

NORMAL_TILE = 8_388_617
"""Values in the tiled block of ``values="normal"``: a prime just above 2**23."""

FIXED_VALUES = (
    (("self_attn.q_norm.weight", "self_attn.k_norm.weight"), 0x3E80),  # bf16 0.25
    (("norm.weight", "layer_scalar"), 0x3F80),  # bf16 1.0
)
"""``values="normal"``: (tensor name endings, bf16 bit pattern) filled with one value,
first match wins."""


def write_synthetic_checkpoint(folder: Path, config_path: Path, values: str = "bits") -> int:
    """Write sharded bf16 safetensors + index + config.json; return bytes of tensor data
    (``values``: one of :data:`VALUES`)."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(config_path, folder / "config.json")
    shapes = e2b_tensor_shapes(config_path)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name in sorted(shapes):
        nbytes = 2 * int(np.prod(shapes[name], dtype=np.int64))
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shapes[name]))
        size += nbytes
    if values not in VALUES:
        raise ValueError(f"values must be one of {VALUES}, got {values!r}")
    if values == "normal":
        # a prime count of values: no two rows of any table repeat each other (a tile of
        # 2**23 values repeats a 1536-wide row every 16,384 rows: tied logits, exact ties)
        block = _normal_bf16_block(NORMAL_TILE).tobytes()
    else:
        block = _random_bf16_block(8 * 2**20).tobytes()  # 16 MiB, tiled
    fixed = [(ends, np.full(2**20, bits, np.uint16).tobytes()) for ends, bits in FIXED_VALUES]
    weight_map: dict[str, str] = {}
    total = 0
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in shard:
            nbytes = 2 * int(np.prod(shape, dtype=np.int64))
            header[name] = {
                "dtype": "BF16",
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
            weight_map[name] = fname
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        at_block = 0
        with open(folder / fname, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for name, shape in shard:  # the random block tiles on across tensors
                left = 2 * int(np.prod(shape, dtype=np.int64))
                fill = next((v for ends, v in fixed if name.endswith(ends)), None)
                if values == "normal" and fill is not None:
                    for at in range(0, left, len(fill)):
                        f.write(fill[: min(len(fill), left - at)])
                    continue
                while left:
                    chunk = block[at_block : at_block + left]
                    f.write(chunk)
                    left -= len(chunk)
                    at_block = (at_block + len(chunk)) % len(block)
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    raw = json.loads(config_path.read_text())
    write_synthetic_tokenizer(folder, raw["text_config"]["vocab_size"])
    return total


SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>")


def write_synthetic_tokenizer(folder: Path, vocab_size: int) -> None:
    """A Gemma-shaped ``tokenizer.json`` of exactly ``vocab_size`` ids, and its config files.

    The shape llama.cpp's ``convert_hf_to_gguf.py`` reads for Gemma 4 (``LlamaHfVocab``:
    BPE with byte fallback, a ``Sequence`` decoder, merges): the special tokens of
    ``testdata/tiny-gemma4`` first (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ...), the 256
    ``<0xNN>`` byte tokens, ``▁``, printable ASCII, 1,024 CJK ideographs as base symbols,
    then their pairs (one merge each) up to ``vocab_size``. The ids, not the text, are what
    the benchmarks compare; ``tokenizer_config.json``, ``generation_config.json`` and
    ``chat_template.jinja`` are copied from ``testdata/tiny-gemma4``.
    """
    vocab: dict[str, int] = {}
    for token in (*SPECIAL_TOKENS, *(f"<0x{b:02X}>" for b in range(256)), "\n", "▁"):
        vocab.setdefault(token, len(vocab))
    for c in range(0x21, 0x7F):
        vocab.setdefault(chr(c), len(vocab))
    base = [chr(0x4E00 + i) for i in range(1024)]
    for c in base:
        vocab.setdefault(c, len(vocab))
    merges = []
    for a in base:
        for b in base:
            if len(vocab) >= vocab_size:
                break
            vocab.setdefault(a + b, len(vocab))
            merges.append([a, b])
    if len(vocab) != vocab_size:
        raise SystemExit(f"synthetic tokenizer: {len(vocab)} ids, not {vocab_size}")
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    ]  # fmt: skip
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    tiny = CONFIGS.parent / "tiny-gemma4"
    for name in ("tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        shutil.copy(tiny / name, folder / name)


BENCH_MARK = ".mobius-bench"
"""File a benchmark leaves in a DIR it owns: only such a DIR's children are ever removed."""


def claim_bench_dir(root: Path) -> None:
    """Make ``root`` the benchmark's own folder, or refuse (SystemExit) if it is someone's.

    A benchmark removes its scratch checkpoints, copies and packages inside DIR between
    and after runs; it may do so only in a folder it created (new or empty, then marked
    with :data:`BENCH_MARK`), never in a folder of the user's files.
    """
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise SystemExit(f"--dir {root}: not a folder; pass a new folder for the benchmark")
    if root.is_dir() and any(root.iterdir()) and not (root / BENCH_MARK).is_file():
        raise SystemExit(
            f"--dir {root} holds files that no benchmark made (no {BENCH_MARK}); "
            "pass a new or empty folder: the benchmark deletes its scratch files there"
        )
    root.mkdir(parents=True, exist_ok=True)
    (root / BENCH_MARK).write_text("scratch folder of a mobius benchmark\n")


def drop_page_cache() -> bool:
    """Write dirty pages and drop the page cache (root on Linux), so a copy reads the disk.

    Returns False where that is not permitted: then "cold" figures are warm and the
    caller says so.
    """
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def timed_cold_copy(ckpt: Path, copy: Path) -> tuple[float, str]:
    """Seconds of ``cp -r ckpt copy`` + sync from a cold page cache (the copy is removed
    after), and a note of whether the cache really was cold; the cache is dropped again
    afterwards so the build that follows reads the disk too."""
    cold = drop_page_cache()
    t = time.perf_counter()
    subprocess.run(["cp", "-r", str(ckpt), str(copy)], check=True)
    os.sync()
    seconds = time.perf_counter() - t
    shutil.rmtree(copy, ignore_errors=True)
    drop_page_cache()
    state = "cold page cache" if cold else "WARM page cache: dropping it is not permitted"
    return seconds, state


def distinct_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``, each inode once (hard links share storage)."""
    seen: dict[tuple[int, int], int] = {}
    for p in folder.rglob("*"):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def _kept_checkpoint(ckpt: Path, marker: Path, values: str) -> int | None:
    """Bytes of tensor data of a checkpoint a previous ``--keep`` run finished with the
    same ``values``, or None."""
    index = ckpt / "model.safetensors.index.json"
    if not marker.is_file() or not index.is_file():
        return None
    try:
        recorded = json.loads(marker.read_text())
        total = json.loads(index.read_text())["metadata"]["total_size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    sizes = {p.name: p.stat().st_size for p in ckpt.glob("*.safetensors")}
    recorded.setdefault("values", "bits")  # markers written before the choice existed
    expected = {"total_size": total, "files": sizes, "values": values}
    return total if recorded == expected else None


def synthetic_e2b(
    root: Path, config_path: Path, keep: bool, profile: str = "", values: str = "bits"
) -> None:
    """(b) Write, copy and build a synthetic full-size E2B; print RSS and ratios.

    With ``keep``, a checkpoint a previous ``--keep`` run finished (marker file with
    its index total, shard sizes and ``values``) is reused instead of written again.
    """
    claim_bench_dir(root)
    ckpt, copy, out = root / "e2b-synthetic", root / "e2b-copy", root / "e2b-package"
    marker = root / "e2b-synthetic.complete.json"
    kept = _kept_checkpoint(ckpt, marker, values) if keep else None
    free = shutil.disk_usage(root).free + (kept or 0)
    if free < 30 * GiB:
        print(f"(b) skipped: {free / GiB:.1f} GiB free in {root}, need ~30 GiB")
        return
    for p in (copy, out) if kept else (ckpt, copy, out, marker):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()
    try:
        if kept:
            nbytes = kept
            print(f"(b) synthetic E2B: reusing {nbytes / GiB:.2f} GiB of bf16 tensors in {ckpt}")
        else:
            t = time.perf_counter()
            nbytes = write_synthetic_checkpoint(ckpt, config_path, values)
            os.sync()
            t_write = time.perf_counter() - t
            sizes = {p.name: p.stat().st_size for p in ckpt.glob("*.safetensors")}
            marker.write_text(json.dumps({"total_size": nbytes, "files": sizes, "values": values}))
            print(
                f"(b) synthetic E2B: {nbytes / GiB:.2f} GiB of bf16 tensors written in "
                f"{t_write:.1f} s"
            )

        t_copy, state = timed_cold_copy(ckpt, copy)
        print(f"    cp -r + sync: {t_copy:.1f} s ({nbytes / GiB / t_copy:.2f} GiB/s, {state})")

        res = _child(BUILD_CHILD, str(ckpt), str(out), "bf16", profile)
        if "error" in res:
            print(f"    build ERROR: {res['error']}")
        else:
            sizes = ", ".join(f"{n} {s / GiB:.2f} GiB" for n, s in res["components"].items())
            print(f"    mobius build --dtype bf16: {res['n_tensors']} tensors, {sizes}")
        print(
            f"    build wall {res['wall_s']:.1f} s = {res['wall_s'] / t_copy:.2f} × cp -r; "
            f"peak RSS {res['peak_rss'] / GiB:.2f} GiB (target ≤ 2 GiB, "
            f"{res['peak_rss'] / (2 * GiB):.2f} × target)"
        )
    finally:
        if not keep:
            for p in (ckpt, copy, out):
                shutil.rmtree(p, ignore_errors=True)
            marker.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=Path, default=CONFIGS, help="folder of full-size configs")
    ap.add_argument("--dtype", default="bf16", choices=["f32", "f16", "bf16"])
    ap.add_argument("--target", default="default", choices=["default", "cpu", "cuda"])
    ap.add_argument("--skip-graph", action="store_true", help="skip (a)")
    ap.add_argument("--synthetic-e2b", type=Path, metavar="DIR", help="run (b) in DIR (~30 GB)")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep (b)'s checkpoint and package; reuse a checkpoint an earlier --keep left",
    )
    ap.add_argument(
        "--profile", default="", metavar="FILE", help="write cProfile stats of (b)'s build to FILE"
    )
    ap.add_argument(
        "--values",
        default="bits",
        choices=VALUES,
        help="(b)'s tensor values: 'bits' (fast, flat logits) or 'normal' (N(0, 0.02) "
        "weights, fixed norms: logits with margins, for comparing greedy ids)",
    )
    args = ap.parse_args(argv)
    if not args.skip_graph:
        graph_only(args.dtype, args.target, args.configs)
    if args.synthetic_e2b:
        synthetic_e2b(
            args.synthetic_e2b,
            args.configs / "gemma-4-E2B-it.json",
            args.keep,
            args.profile,
            args.values,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
