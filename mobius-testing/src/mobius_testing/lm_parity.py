"""L3 parity of decoder-LM families against HF transformers (torch, CPU): the shared harness.

A family's parity tests are then a list of tiny checkpoint specs (hub-style
``config.json`` dicts) and a few parametrized calls of the ``assert_*`` checks below:

- :func:`make_checkpoint` writes one seeded random model twice, with the same weights:
  ``saved/`` exactly as ``save_pretrained`` writes it (transformers 5 config shape,
  ``rope_parameters``) and ``hub/`` with the spec itself as ``config.json`` (the Hub's
  shape: top-level ``rope_theta`` + ``rope_scaling``). Every constant-initialised
  parameter (norm weights, biases) is perturbed, so a builder that drops or misplaces
  one shows up as a logit difference.
- :class:`ReferenceCache`: checkpoints, HF models and mobius builds, each made once.
- The reference for a prefill of ``P`` tokens and ``N`` single-token cached steps is one
  causal no-cache HF forward over the ``P + N`` tokens (position ``t`` sees ``0..t``,
  exactly what the package sees there); packages run only through
  ``mobius_runtime.Pipeline``.

torch and transformers (the ``[reference]`` extra) are imported inside the functions.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

PREFILL = 24
"""Prompt length of the parity runs (three windows of 8 for a windowed spec)."""
DECODE = 16
"""Cached single-token decode steps after the prefill."""
SEED = 1234
F32_ATOL = 1e-4
F16_TIE = 0.02
"""f16: a differing pick counts as a tie when its reference logit is within this of the
reference maximum (ties of a random tiny model that half precision cannot resolve)."""
GQA_DTYPES = {"cpu": ("f32", "f16"), "cuda": ("f16", "bf16")}


def parity_ids(max_id: int, *, low: int = 3, seed: int = SEED) -> np.ndarray:
    """Seeded prompt ids ``[1, PREFILL + DECODE]`` drawn from ``[low, max_id)``."""
    rng = np.random.default_rng(seed)
    return rng.integers(low, max_id, size=(1, PREFILL + DECODE), dtype=np.int64)


def family_fixtures(
    family: str,
    folder: Path,
    specs: Mapping[str, Mapping[str, Any]],
    max_prompt_id: int,
    make: Callable[[str, Mapping[str, Any], Path], CheckpointPair] | None = None,
):
    """A family conftest's ``(pytest_collection_modifyitems, parity_ids, reference_cache)``:
    the ``family(family)`` marker hook for the tests under ``folder``, the session's prompt
    ids (:func:`parity_ids`) and a session :class:`ReferenceCache` of ``specs`` (skipped
    without torch / transformers). Assign the three to those names in the conftest."""

    @pytest.hookimpl(tryfirst=True)
    def hook(config: pytest.Config, items: list[pytest.Item]) -> None:
        mark_family(items, folder, family)

    @pytest.fixture(scope="session", name="parity_ids")
    def ids() -> np.ndarray:
        return parity_ids(max_prompt_id)

    @pytest.fixture(scope="session", name="reference_cache")
    def cache(tmp_path_factory: pytest.TempPathFactory) -> ReferenceCache:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
        root = tmp_path_factory.mktemp(f"{family}-l3")
        return ReferenceCache(root, specs, make or make_checkpoint)

    return hook, ids, cache


def mark_family(items: list[pytest.Item], folder: Path, family: str) -> None:
    """Mark every item under ``folder`` ``family(family)`` unless it has a family marker
    (call it from a ``tryfirst`` ``pytest_collection_modifyitems`` of the family's conftest,
    so the harness's ``--families`` filter sees it)."""
    for item in items:
        if item.get_closest_marker("family") is None and folder in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.family(family))


@dataclass(frozen=True)
class CheckpointPair:
    name: str
    model_type: str
    saved: Path
    hub: Path


def make_checkpoint(
    name: str,
    raw: Mapping[str, Any],
    root: Path,
    seed: int = 0,
    *,
    adjust: Callable[[Any], None] | None = None,
    hub_tensors: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> CheckpointPair:
    """A seeded random ``AutoModelForCausalLM`` of hub-style config ``raw``, written twice.

    ``adjust(model)`` runs (under ``no_grad``) after the perturbation, e.g. to sharpen a
    router; ``hub_tensors`` maps the saved tensors to those of ``hub/`` (another accepted
    layout), else ``hub/`` holds the same file.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    kwargs = {k: v for k, v in raw.items() if k not in ("model_type", "architectures")}
    config = AutoConfig.for_model(raw["model_type"], **kwargs)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            if flat.numel() and bool((flat == flat[0]).all()):
                p.add_(torch.randn(p.shape, generator=generator) * 0.1)
        if adjust is not None:
            adjust(model)
    saved, hub = root / "saved", root / "hub"
    model.save_pretrained(saved)
    hub.mkdir(parents=True, exist_ok=True)
    if hub_tensors is None:
        shutil.copyfile(saved / "model.safetensors", hub / "model.safetensors")
    else:
        from safetensors.torch import load_file, save_file

        tensors = hub_tensors(load_file(saved / "model.safetensors"))
        save_file(tensors, hub / "model.safetensors", metadata={"format": "pt"})
    (hub / "config.json").write_text(json.dumps(dict(raw), indent=2) + "\n")
    return CheckpointPair(name, raw["model_type"], saved, hub)


def load_model(folder: Path):
    """HF's model of ``folder`` on CPU, float32, eager attention."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


class ReferenceCache:
    """Checkpoints, HF models and mobius builds of ``specs``, each made once per session."""

    def __init__(
        self,
        root: Path,
        specs: Mapping[str, Mapping[str, Any]],
        make: Callable[[str, Mapping[str, Any], Path], CheckpointPair] = make_checkpoint,
    ) -> None:
        self.root, self.specs, self.make = root, specs, make
        self._pairs: dict[str, CheckpointPair] = {}
        self._hf: dict[str, Any] = {}
        self._builds: dict[tuple[str, str, str, str], Any] = {}

    def checkpoint(self, name: str) -> CheckpointPair:
        if name not in self._pairs:
            self._pairs[name] = self.make(name, self.specs[name], self.root / "ckpt" / name)
        return self._pairs[name]

    def model(self, name: str):
        if name not in self._hf:
            self._hf[name] = load_model(self.checkpoint(name).saved)
        return self._hf[name]

    def build(self, name: str, style: str = "saved", dtype: str = "f32", target: str = "default"):
        key = (name, style, dtype, target)
        if key not in self._builds:
            import mobius

            folder = getattr(self.checkpoint(name), style)
            out = self.root / "pkg" / "-".join(key)
            self._builds[key] = mobius.build(str(folder), str(out), dtype=dtype, target=target)
        return self._builds[key]


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        t = torch.from_numpy(ids.astype(np.int64))
        out = model(input_ids=t, attention_mask=torch.ones_like(t), use_cache=False)
    return out.logits.float().numpy()


def hf_greedy(model, prompt: np.ndarray, new_tokens: int) -> list[int]:
    """``generate`` with HF's own KV cache, greedy, no stop id: ``new_tokens`` ids."""
    import torch

    with torch.no_grad():
        t = torch.from_numpy(prompt.astype(np.int64))
        out = model.generate(
            input_ids=t,
            attention_mask=torch.ones_like(t),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, t.shape[1] :].tolist()


def load_pipeline(package: Path):
    from mobius_runtime import Pipeline

    return Pipeline.load(package, device="cpu", threads=1)


def step_logits(pipeline, ids: np.ndarray, prompt_len: int) -> np.ndarray:
    """Prefill ``ids[:, :prompt_len]``, then one cached step per remaining id; ``[B, T, V]``."""
    outs, state = pipeline.step(input_ids=ids[:, :prompt_len])
    chunks = [outs["logits"].astype(np.float32)]
    for s in range(prompt_len, ids.shape[1]):
        step, state = pipeline.step(state, input_ids=ids[:, s : s + 1])
        chunks.append(step["logits"].astype(np.float32))
    return np.concatenate(chunks, axis=1)


def assert_gguf_matches(ref_pipe, gguf_pipe, kind: str, label: str, *, seed: int) -> float:
    """A package built from a GGUF file written from a checkpoint is that checkpoint's
    model: logits over a 16-id prefill + 8 cached steps within 1e-4 of the safetensors
    build's (float tensors), or, for ``Q8_0`` (int8 blocks of 32, which a random tiny
    model amplifies to a few percent of its logits), top-1 equal at >= 90 % of the
    positions; 12 greedy ids equal either way. Returns max|Δ logits|."""
    ids = np.random.default_rng(seed).integers(6, 512, size=(1, 24), dtype=np.int64)
    ref = step_logits(ref_pipe, ids, 16)
    got = step_logits(gguf_pipe, ids, 16)
    delta = float(np.abs(ref - got).max())
    scale = float(np.abs(ref).max())
    print(f"\n[{label} gguf {kind}] max|Δ logits| vs safetensors: {delta:.3e} (of {scale:.2f})")
    if kind == "Q8_0":
        assert (ref.argmax(-1) == got.argmax(-1)).mean() >= 0.9
    else:
        assert delta <= 1e-4
    prompt = [5, 17, 42, 99]
    want = ref_pipe.generate(input_ids=prompt, max_new_tokens=12).ids
    assert gguf_pipe.generate(input_ids=prompt, max_new_tokens=12).ids == want
    return delta


def top1(ref: np.ndarray, got: np.ndarray, tie: float = 0.0) -> tuple[float, float]:
    """(strict top-1 agreement, tie-aware agreement): a differing pick counts as a tie
    when its reference logit is within ``tie`` of the reference maximum."""
    r = ref.reshape(-1, ref.shape[-1])
    g = got.reshape(-1, got.shape[-1])
    strict = r.argmax(-1) == g.argmax(-1)
    picked = r[np.arange(len(g)), g.argmax(-1)]
    return float(strict.mean()), float((strict | (picked >= r.max(-1) - tie)).mean())


def attention_ops(package: Path) -> dict[str, int]:
    """How many ``Attention`` / ``GroupQueryAttention`` nodes the ``model`` graph holds."""
    import onnx

    manifest = json.loads((package / "mobius.json").read_text())
    path = package / manifest["components"]["model"]["path"]
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        if node.op_type in ("Attention", "GroupQueryAttention"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def expected_attention(target: str, dtype: str) -> str:
    return "GroupQueryAttention" if dtype in GQA_DTYPES.get(target, ()) else "Attention"


def report(label: str, ref: np.ndarray, got: np.ndarray, tie: float = 0.0):
    """Print (``-s``) and return ``(max|Δ|, strict top-1, tie-aware top-1)``."""
    delta = np.abs(ref - got)
    strict, aware = top1(ref, got, tie)
    print(
        f"\n[L3] {label}: max|Δ| {delta.max():.3e} (prefill {delta[:, :PREFILL].max():.3e}, "
        f"decode {delta[:, PREFILL:].max():.3e}), top-1 {strict:.1%} (tie-aware {aware:.1%}) "
        f"over {PREFILL}+{DECODE} positions"
    )
    return float(delta.max()), strict, aware


def assert_f32_parity(cache: ReferenceCache, ids: np.ndarray, name: str, target: str) -> None:
    """f32 package on ``target``: one attention op per layer of the expected kind,
    max|Δ logits| ≤ :data:`F32_ATOL` and 100 % top-1 over prefill + cached steps."""
    ref = hf_logits(cache.model(name), ids)
    package = cache.build(name, target=target).out
    layers = cache.specs[name]["num_hidden_layers"]
    assert attention_ops(package) == {expected_attention(target, "f32"): layers}
    got = step_logits(load_pipeline(package), ids, PREFILL)
    assert got.shape == ref.shape
    delta, strict, _ = report(f"{name} f32 target={target}", ref, got)
    assert delta <= F32_ATOL, f"{name} {target}: max|Δ logits| {delta:.3e} > {F32_ATOL}"
    assert strict == 1.0, f"{name} {target}: top-1 {strict:.1%}"


def assert_greedy(cache: ReferenceCache, ids: np.ndarray, name: str, target: str) -> None:
    """:data:`DECODE` greedy ids of ``Pipeline.generate`` equal HF ``generate``'s."""
    prompt = ids[:, :PREFILL]
    want = hf_greedy(cache.model(name), prompt, DECODE)
    pipeline = load_pipeline(cache.build(name, target=target).out)
    got = pipeline.generate(input_ids=prompt, max_new_tokens=DECODE, stop_ids=()).ids
    print(f"\n[L3] {name} target={target} greedy: HF {want} mobius {got}")
    assert got == want


def assert_f16_top1(
    cache: ReferenceCache,
    ids: np.ndarray,
    name: str,
    target: str,
    excusable: np.ndarray | None = None,
    max_excused: float = 0.05,
) -> None:
    """f16 package: finite logits, tie-aware top-1 100 % (tie: :data:`F16_TIE`).

    ``excusable`` (bool per position) marks positions whose reference itself is a near-tie
    half precision may resolve otherwise (an MoE routing tie); a miss there is excused, at
    most on ``max_excused`` of the positions.
    """
    ref = hf_logits(cache.model(name), ids)
    got = step_logits(
        load_pipeline(cache.build(name, dtype="f16", target=target).out), ids, PREFILL
    )
    assert np.isfinite(got).all()
    report(f"{name} f16 target={target}", ref, got, F16_TIE)
    r, g = ref[0], got[0]
    picked = r[np.arange(len(g)), g.argmax(-1)]
    agree = (r.argmax(-1) == g.argmax(-1)) | (picked >= r.max(-1) - F16_TIE)
    if excusable is not None:
        excused = ~agree & excusable
        print(
            f"[L3] {name} f16 target={target}: {int(excusable.sum())} excusable position(s) "
            f"{np.nonzero(excusable)[0].tolist()}; misses there: {np.nonzero(excused)[0].tolist()}"
        )
        assert excused.mean() <= max_excused, f"{name} f16: {int(excused.sum())} misses excused"
        agree = agree | excusable
    assert agree.all(), f"{name} f16 {target}: misses at {np.nonzero(~agree)[0].tolist()}"


def assert_shapes_identical(cache: ReferenceCache, ids: np.ndarray, name: str) -> None:
    """save_pretrained's config shape and the Hub's build to bit-identical outputs."""
    saved = step_logits(load_pipeline(cache.build(name).out), ids, PREFILL)
    hub = step_logits(load_pipeline(cache.build(name, style="hub").out), ids, PREFILL)
    print(f"\n[L3] {name}: hub vs saved shape, max|Δ| {np.abs(saved - hub).max():.3e}")
    assert np.array_equal(saved, hub)


def graph_parameters(model) -> int:
    """Parameters of an ``ir.Model`` built graph-only: the initializers without data
    (architecture constants such as ``rope.inv_freq`` carry theirs)."""
    import math

    return sum(
        math.prod(int(d) for d in v.shape)
        for v in model.graph.initializers.values()
        if v.const_value is None
    )


def kv_geometry(model) -> list[list[int]]:
    """``[kv_heads, head_dim]`` of each layer's ``past_key_values.{i}.key`` input, in order."""
    dims = {}
    for value in model.graph.inputs:
        if value.name.startswith("past_key_values.") and value.name.endswith(".key"):
            dims[int(value.name.split(".")[1])] = [int(value.shape[1]), int(value.shape[3])]
    return [dims[i] for i in sorted(dims)]


def hf_meta_counts(config_file: Path) -> dict[str, Any]:
    """What HF counts for a ``config.json`` on the meta device (nothing allocated):
    ``sum(p.numel())`` (a tied head counted once) and each layer's KV geometry."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_file)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "model_type": config.model_type,
        "params": sum(p.numel() for p in model.parameters()),
        "cache_geometry": [[config.num_key_value_heads, head_dim]] * config.num_hidden_layers,
    }


def write_expectations(configs: Path, names: Sequence[str], out: Path) -> None:
    """Write ``{name: hf_meta_counts(configs / name)}`` to ``out`` (a family's one-off
    ``make_l2_expected.py``) and print the counts."""
    found = {name: hf_meta_counts(configs / name) for name in names}
    out.write_text(json.dumps(found, indent=1) + "\n")
    for name, e in found.items():
        print(f"{name}: {e['params']:,} parameters")


def assert_graph_only(plugin, config_file: Path, target: str, expected: Mapping[str, Any]) -> None:
    """L2: the family ``plugin``'s hooks (a module or a plugin object) build the real config graph-only (bf16, no
    weights) with exactly ``expected``'s parameters and KV geometry, and the graph meets
    the contract. The build time is printed, not judged."""
    import time

    from mobius.contract import validate
    from mobius.records import BuildOptions

    raw = json.loads(config_file.read_text())
    config = plugin.mobius_read_config(raw["model_type"], raw)
    options = BuildOptions(dtype="bf16", target=target)
    start = time.perf_counter()
    model = plugin.mobius_build_component(config, "model", options)
    seconds = time.perf_counter() - start
    params = graph_parameters(model)
    print(f"\n[L2] {config_file.name} target={target}: {params:,} parameters, {seconds:.1f} s")
    assert params == expected["params"]
    assert kv_geometry(model) == expected["cache_geometry"]
    validate(plugin.mobius_pipeline_contract(config, options), {"model": model})


def plugins_listed(monkeypatch: pytest.MonkeyPatch, allow: str | None) -> dict[str, dict]:
    """``mobius plugins --json`` by plugin name, with ``MOBIUS_PLUGINS`` set to ``allow``
    (None: unset): what a family's install / uninstall changes for core."""
    from typer.testing import CliRunner

    from mobius.cli import app

    if allow is None:
        monkeypatch.delenv("MOBIUS_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("MOBIUS_PLUGINS", allow)
    result = CliRunner().invoke(app, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    return {r["name"]: r for r in json.loads(result.output)}


def parity_tests(
    specs: Mapping[str, Mapping[str, Any]],
    targets: Sequence[str] = ("default", "cpu", "cuda"),
    f16_targets: Sequence[str] = ("default", "cpu"),
):
    """A family's standard L3 tests over every spec, parametrized by spec name and target:
    ``(test_f32_parity, test_greedy_16_steps, test_f16_top1,
    test_config_shapes_build_identically)``. Assign them to those names in the family's
    test module (pytest collects them there, with that module's marks and fixtures)."""
    names = sorted(specs)
    by_name = pytest.mark.parametrize("name", names)

    @pytest.mark.parametrize("target", targets)
    @by_name
    def test_f32_parity(reference_cache, parity_ids, name, target):
        assert_f32_parity(reference_cache, parity_ids, name, target)

    @pytest.mark.parametrize("target", targets)
    @by_name
    def test_greedy_16_steps(reference_cache, parity_ids, name, target):
        assert_greedy(reference_cache, parity_ids, name, target)

    @pytest.mark.parametrize("target", f16_targets)
    @by_name
    def test_f16_top1(reference_cache, parity_ids, name, target):
        assert_f16_top1(reference_cache, parity_ids, name, target)

    @by_name
    def test_config_shapes_build_identically(reference_cache, parity_ids, name):
        assert_shapes_identical(reference_cache, parity_ids, name)

    return (
        test_f32_parity,
        test_greedy_16_steps,
        test_f16_top1,
        test_config_shapes_build_identically,
    )


# The child's peak is VmHWM, the high-water mark of its own address space. Not
# ru_maxrss: Linux carries it across exec from the address space the child started in,
# which under vfork / posix_spawn (what subprocess uses) is the parent's, so a build
# started from a pytest holding HF's Gemma 3 reported that pytest's 1.8 GB.
_MEASURED_BUILD = """
import json, resource, sys, time
from mobius.cli import main

def peak_rss():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

start = time.perf_counter()
sys.argv = ["mobius", "build", *sys.argv[1:]]
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
print("MOBIUS_BUILD_STATS " + json.dumps({
    "code": code, "seconds": time.perf_counter() - start, "peak_rss": peak_rss()}))
sys.exit(code)
"""


@dataclass(frozen=True)
class MeasuredBuild:
    """A ``mobius build`` run in its own process (so its peak RSS is the build's)."""

    out: Path
    seconds: float
    peak_rss: int
    """Bytes (Linux ``VmHWM`` of the build's process, file pages included)."""
    package_bytes: int
    stdout: str


def measured_build(source: Path, out: Path, *args: str, timeout: float = 1800) -> MeasuredBuild:
    """``mobius build SOURCE OUT ARGS`` in a child Python; fails the test when it fails."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _MEASURED_BUILD, str(source), str(out), *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("MOBIUS_BUILD_STATS "))
    stats = json.loads(line.split(" ", 1)[1])
    size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    return MeasuredBuild(Path(out), stats["seconds"], stats["peak_rss"], size, done.stdout)


def measured_builder(
    source: str, out: Path, *, dtype: str | None, target: str, revision: str | None
) -> MeasuredBuild:
    """A :data:`mobius_testing.runner.Builder` running :func:`measured_build` (the CLI's
    arguments for ``dtype`` None / target ``default``: none, as a user types it)."""
    args = [*(["--dtype", dtype] if dtype else []), *(["--target", target] if target != "default" else []),
            *(["--revision", revision] if revision else [])]  # fmt: skip
    return measured_build(Path(source), Path(out), *args)


def measure_harness_builds(config: pytest.Config) -> None:
    """Make the harness build every package of the session with :func:`measured_builder`
    (a conftest's ``pytest_configure``): the golden case items and the tests that check a
    build's memory and size then share one build of each package, whichever runs first."""
    from mobius_testing.pytest_plugin import harness_state

    harness_state(config).builds.builder = measured_builder


def real_gguf(case_file: Path) -> Path:
    """The GGUF file a golden case file pins (looked up and sha256-checked as the case
    items do, :meth:`mobius_testing.cases.Case.build_source`): skips with the case's
    reason where it is absent, fails where it must be present or its sha256 differs."""
    from mobius_testing.cases import load_case

    case = load_case(case_file)
    reason = case.skip_reason()
    if reason:
        pytest.skip(reason)
    return Path(case.build_source())


def real_builds(
    config: pytest.Config, source: Path, dtypes: Mapping[str, str | None], name: str
) -> dict[str, MeasuredBuild]:
    """The session's measured builds of ``source`` by label (``dtype`` None keeps a GGUF
    file's quantization), shared with the golden case items of the same packages."""
    from mobius_testing.pytest_plugin import harness_state

    cache = harness_state(config).builds
    out = {}
    for label, dtype in dtypes.items():
        out[label] = done = cache.records[cache.build(source, dtype=dtype)]
        assert isinstance(done, MeasuredBuild), "the conftest calls measure_harness_builds"
        ratio = done.package_bytes / source.stat().st_size
        print(f"\n[{name} {label}] build {done.seconds:.1f} s, peak RSS "
              f"{done.peak_rss / 2**20:.0f} MiB, package {done.package_bytes:,} bytes = "
              f"{ratio:.3f}x the GGUF file")  # fmt: skip
    return out
