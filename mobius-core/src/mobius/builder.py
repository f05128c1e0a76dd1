"""The build pipeline: checkpoint in, model package out (docs/architecture.md §5).

    open checkpoint (firstresult)  -> owner of config["model_type"]
    -> mobius_read_config          -> typed config
    -> mobius_pipeline_contract    -> components + edges
    -> every component's weight plan, checked against the checkpoint's headers
    -> per component: build -> optimize (every plugin) -> (its weight plan)
       -> [--quant: rewrite to MatMulNBits / GatherBlockQuantized, lazy quantize step]
       -> bind
    -> validate(contract, graphs)
    -> runtime files -> write_package (atomic, streamed) -> OUT/

Cheap checks run first (OUT allowed by :mod:`mobius.outdir`, config.json readable,
a plugin owns the model type, the checkpoint's tensor names and shapes fit every
weight plan) so a user mistake costs nothing. Tensor data is read only while the
package is written. Nothing appears at OUT unless the whole build succeeded:
the package writer assembles a temporary sibling and renames it into place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from mobius.errors import BuildError, CheckpointError, MobiusError
from mobius.progress import BuildProgress, NullProgress

if TYPE_CHECKING:
    from mobius.plugins import PluginHost
    from mobius.records import BuildOptions, QuantOptions

log = logging.getLogger("mobius.builder")

VERSIONED_LIBRARIES = ("onnx", "onnxscript", "onnx-ir")


@dataclass(frozen=True)
class BuildResult:
    """What a finished build wrote.

    ``components`` maps component name to its size on disk in bytes (graph and
    external data); ``unused`` lists checkpoint tensors no component used and no
    plan ignored.
    """

    out: Path
    model_type: str
    components: Mapping[str, int]
    n_tensors: int
    unused: tuple[str, ...]
    seconds: float
    weight_errors: Mapping[str, tuple[float, int]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """A GGUF build's ``--target cpu`` approximations: source type → (largest weight
    error against gguf's dequantization, tensors)."""


def build(
    source: str,
    out: str | Path,
    *,
    dtype: str | None = None,
    target: str = "default",
    revision: str | None = None,
    force: bool = False,
    progress: BuildProgress | None = None,
    host: PluginHost | None = None,
    quant: str | QuantOptions | None = None,
    logits: str = "all",
    mmproj: str | None = None,
) -> BuildResult:
    """Build ``source`` (a checkpoint folder, a GGUF file or Hub id) into a package at ``out``.

    ``host`` defaults to the installed plugins; ``progress`` receives per-stage
    messages and per-tensor writes. ``quant`` (``"int4"``, ``"int8"`` or a
    :class:`~mobius.records.QuantOptions` for block size, symmetry, accuracy level and
    excludes) makes a weight-only quantized package (``docs/quantization.md``).
    ``dtype`` None: ``f32``, and a GGUF file keeps its own quantization (its blocks
    become MatMulNBits / GatherBlockQuantized as they are; ``--target cpu``: the fast
    forms); any ``dtype`` given dequantizes it.
    ``logits="last"`` makes the decoder's logits output cover the last position only
    (families on :mod:`mobius.lm`; a BuildError for a family that does not honour it).
    ``mmproj`` names a GGUF model's companion file (llama.cpp's ``mmproj`` file with its
    vision / audio encoders; ``"none"``: the model file alone); without it, the one
    ``mmproj*.gguf`` file beside a GGUF model is read with it when its family reads such
    files.
    Raises a :class:`~mobius.errors.MobiusError` subclass for anything a user can
    fix; OUT is untouched then.
    """
    started = time.perf_counter()
    progress = progress or NullProgress()
    out_path = Path(out).expanduser()
    keep_source = dtype is None and quant is None
    dtype = dtype or "f32"
    options = build_options(dtype, target, quant, logits)
    if dtype == "bf16" and target != "cuda":
        # the package builds, but onnxruntime's CPU kernels have no bfloat16 for its ops
        # (mobius_runtime's bf16-on-CPU check refuses it at load; tests/test_bf16_on_cpu.py)
        log.warning(
            "--dtype bf16 with --target %s: the package will run on CUDA only "
            "(onnxruntime's CPU kernels have no bfloat16); for CPU build with --dtype f32, "
            "or pass --target cuda to say CUDA is meant",
            target,
        )
    from mobius.outdir import check_package_out

    local = looks_local(source)
    from mobius.checkpoint.gguf import NO_COMPANION, is_gguf_source

    companions = [mmproj] if mmproj is not None and mmproj.strip().lower() != NO_COMPANION else []
    if companions and not (local and is_gguf_source(source)):
        raise BuildError(
            "--mmproj names the encoder file of a GGUF model, but SRC is no GGUF file",
            where=source,
            fix="pass the model's .gguf file as SRC, or drop --mmproj",
        )
    out_path = check_package_out(
        out_path,
        force=force,
        sources=[source, *companions] if local else [],
        notice=progress.message,
    )

    if host is None:
        from mobius.plugins import PluginHost

        host = PluginHost.load()

    # Fail fast on a local folder before any safetensors header is read.
    if local and not is_gguf_source(source):
        from mobius.config import read_config_file

        model_type, local_raw = read_config_file(source)
        refuse_quantized_checkpoint(local_raw, source)
        host.owner(model_type)

    progress.message(f"opening {source}")
    checkpoint = host.open_checkpoint(source, revision, mmproj)
    if checkpoint is None:
        raise CheckpointError(
            f"no plugin recognises the checkpoint source {source!r}",
            where=source,
            fix="pass an existing local folder or a HuggingFace Hub id (org/name)",
        )
    companion = getattr(checkpoint, "companion", None)
    if companion is not None:
        progress.message(f"mmproj companion {companion}: read with the model")
    if getattr(checkpoint, "companion_note", ""):
        progress.message(checkpoint.companion_note)

    from mobius.config import model_type_of

    raw = dict(checkpoint.raw_config)
    model_type = model_type_of(raw, where=f"{source}/config.json")
    refuse_quantized_checkpoint(raw, source)
    owner = host.owner(model_type)
    owner_record = host.record(owner)
    progress.message(f"model_type {model_type}: plugin {owner}")

    config = host.read_config(model_type, raw)
    contract = host.pipeline_contract(model_type, config, options)
    _check_logits(contract, options, owner)

    from mobius.chat_files import chat_files, check_chat_template

    files = host.runtime_files(model_type, config, contract, checkpoint, options)
    files = [*files, *chat_files(checkpoint, files)]
    _check_runtime_files(files)  # before the (long) graph build
    check_chat_template(files)

    keep = None
    if keep_source and hasattr(checkpoint, "kept_scheme"):
        from mobius.quantization import SourceQuant

        keep = SourceQuant(checkpoint, options.target)
    graphs, n_tensors, unused, quant_reports = _build_components(
        host, model_type, config, contract, checkpoint, options, progress, keep
    )

    from mobius.contract import validate

    progress.message("validating the pipeline contract against the graphs")
    validate(contract, graphs)

    manifest = {
        "model_type": model_type,
        "task": _task(host, model_type),
        "dtype": options.dtype,
        "target": options.target,
        "contract": contract.to_dict(),
        "source": {**source_to_dict(checkpoint.source), **_tensor_types(checkpoint)},
        "versions": versions(owner_record.distribution, owner_record.version),
        # the raw config.json, so a runtime can rebuild the typed config for processors
        "config": raw,
    }
    if options.quant is not None:
        from mobius.quantization import manifest_entry

        manifest["quantization"] = manifest_entry(options, quant_reports, graphs)
    elif keep is not None:
        manifest["quantization"] = keep.manifest_entry(options, quant_reports, graphs)
        for line in keep.dequantized(quant_reports) + keep.corrected(quant_reports):
            progress.message(line)

    from mobius.package import write_package

    written = Path(
        write_package(
            out_path,
            components=graphs,
            manifest=manifest,
            runtime_files=files,
            force=force,
            progress=progress,
        )
    )
    sizes = component_sizes(written)
    errors = keep.approximations() if keep is not None else {}
    for kind, (error, count) in errors.items():
        progress.message(
            f"--target cpu: {count} {kind} tensor(s) as int8 blocks, largest weight error "
            f"{error:.3g} against gguf's dequantization"
        )
    return BuildResult(
        out=written,
        model_type=model_type,
        components=sizes,
        n_tensors=n_tensors,
        unused=unused,
        seconds=time.perf_counter() - started,
        weight_errors=MappingProxyType(errors),
    )


def _build_components(
    host: PluginHost,
    model_type: str,
    config: Any,
    contract: Any,
    checkpoint: Any,
    options: Any,
    progress: BuildProgress,
    keep: Any = None,
) -> tuple[dict[str, Any], int, tuple[str, ...], dict[str, Any]]:
    """Build, optimize, quantize (when asked, or ``keep``: the checkpoint's own blocks)
    and bind every component; return graphs, tensor count, unused names and the
    quantization report of each component."""
    from mobius.weights import bind

    plans = _checked_plans(host, model_type, config, contract, checkpoint, options, progress)
    quant_reports: dict[str, Any] = {}
    graphs: dict[str, Any] = {}
    n_tensors = 0
    unused: set[str] | None = None
    ignored: dict[str, str] = {}
    for component in contract.components:
        name = component.name
        progress.message(f"building {name}")
        model = host.build_component(model_type, config, name, options)
        model = host.optimize_component(model, name, options.target)
        plan = plans[name]
        if options.quant is not None:
            from mobius.quantization import quantize_component

            overrides = host.quant_overrides(model_type, config, name, options)
            plan, quant_reports[name] = quantize_component(
                model,
                plan,
                options.quant,
                target=options.target,
                overrides=overrides,
                search=options.quant.search,
            )
        elif keep is not None:
            from mobius.quantization import quantize_component

            plan, quant_reports[name] = quantize_component(
                model, plan, None, target=options.target, keep=keep
            )
        report = bind(model, plan, checkpoint, component=name)
        n_tensors += report.bound
        this_unused = set(report.unused)
        unused = this_unused if unused is None else unused & this_unused
        ignored.update(report.ignored)
        graphs[name] = model
    leftover = tuple(sorted((unused or set()) - set(ignored)))
    for tensor, reason in sorted(ignored.items()):
        log.info("checkpoint tensor %s not used: %s", tensor, reason)
    if leftover:
        shown = ", ".join(leftover[:20]) + (" …" if len(leftover) > 20 else "")
        text = f"{len(leftover)} checkpoint tensor(s) used by no component: {shown}"
        log.info(text)
        progress.message(text)
    if options.quant is not None:
        from mobius.quantization import unmatched_excludes

        for glob in unmatched_excludes(options.quant, quant_reports.values()):
            log.warning("--quant-exclude %r matched no quantizable tensor", glob)
    return graphs, n_tensors, leftover, quant_reports


def _checked_plans(
    host: PluginHost,
    model_type: str,
    config: Any,
    contract: Any,
    checkpoint: Any,
    options: Any,
    progress: BuildProgress,
) -> dict[str, Any]:
    """Every component's weight plan, checked against the checkpoint before any graph is
    built (:func:`mobius.weights.plan_problems`); one WeightPlanError lists every problem.

    Why first: graph building can take minutes for a large config; a checkpoint that
    cannot match it (a config claiming 4,096 layers, renamed or reshaped tensors) is
    refused in seconds, from safetensors headers alone. Shapes against the graph are
    checked later by :func:`mobius.weights.bind`, when the graph exists.
    """
    from mobius.errors import WeightPlanError
    from mobius.weights import non_float_sources, plan_problems

    progress.message("checking the checkpoint against the weight plan")
    plans: dict[str, Any] = {}
    problems: list[str] = []
    for component in contract.components:
        name = component.name
        plan = host.weight_plan(model_type, config, name, checkpoint, options)
        plans[name] = plan
        _refuse_non_float(non_float_sources(plan, checkpoint), checkpoint)
        problems += [f"{name}: {p}" for p in plan_problems(plan, checkpoint)[0]]
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise WeightPlanError(
            f"the checkpoint does not match what config.json describes "
            f"({len(problems)} problem(s)), found before building any graph:\n{listing}",
            where=f"checkpoint {checkpoint.root}",
            fix="use the config.json that belongs to these weights (sizes such as the "
            "number of layers must match the checkpoint), or the checkpoint it was written for",
        )
    return plans


def _refuse_non_float(found: list[tuple[str, str, str]], checkpoint: Any) -> None:
    """CheckpointError naming the first integer / bool tensor a float parameter would read."""
    if not found:
        return
    from mobius.errors import CheckpointError

    initializer, tensor, dtype = found[0]
    more = len({t for _, t, _ in found}) - 1
    raise CheckpointError(
        f"checkpoint tensor {tensor!r} is {dtype}, but it holds the float parameter "
        f"{initializer!r}: the checkpoint looks quantized (raw int8, bitsandbytes, ...), and "
        "casting its integers to float would give garbage"
        + (f" ({more} more such tensor(s))" if more > 0 else ""),
        where=f"{checkpoint.info(tensor).file.name}: {tensor}",
        fix="build from the float (bfloat16 / float16 / float32) checkpoint; "
        "`--quant int4|int8` quantizes it for you",
    )


def _check_logits(contract: Any, options: BuildOptions, owner: str) -> None:
    """``--logits last`` only for a family whose contract then gives one logits position."""
    if options.logits != "last":
        return
    for key in contract.outputs:
        comp, port = key.split(".", 1)
        shape = next(p.shape for p in contract.component(comp).outputs if p.name == port)
        if len(shape) != 3 or shape[1] != 1:
            raise BuildError(
                f"the {owner} plugin does not build last-position logits ({key} is {list(shape)})",
                where="mobius build --logits last",
                fix="drop --logits last for this model type (it keeps every position)",
            )


def build_options(
    dtype: str, target: str, quant: str | QuantOptions | None, logits: str = "all"
) -> BuildOptions:
    """Checked :class:`~mobius.records.BuildOptions`; a BuildError naming every problem."""
    from mobius.errors import BuildError
    from mobius.records import BuildOptions, QuantOptions

    try:
        if isinstance(quant, str):
            quant = QuantOptions(method=quant)
        options = BuildOptions(dtype=dtype, target=target, quant=quant, logits=logits)
    except ValueError as exc:
        raise BuildError(
            str(exc),
            where="build options",
            fix="use --dtype f32|f16|bf16, --target default|cpu|cuda, --logits all|last, "
            "--quant int4|int8, "
            "--block-size 16|32|64|128|256, --accuracy-level 0..4",
        ) from exc
    if quant is not None and dtype == "bf16" and target == "cpu":
        raise BuildError(
            f"--quant {quant.method} with --dtype bf16 cannot run on --target cpu: "
            "onnxruntime's CPU MatMulNBits / GatherBlockQuantized have no bfloat16 kernels",
            where="build options",
            fix="use --dtype f32 (q4 for CPU) or f16, or --target cuda for bf16",
        )
    return options


def refuse_quantized_checkpoint(raw: Mapping[str, Any], source: str) -> None:
    """A checkpoint already quantized (GPTQ, AWQ, ...) is refused before anything is read."""
    qc = raw.get("quantization_config")
    if not qc:
        return
    method = qc.get("quant_method", "unknown") if isinstance(qc, Mapping) else "unknown"
    raise CheckpointError(
        f"the checkpoint is already quantized (quantization_config.quant_method = "
        f"{method!r}); building pre-quantized checkpoints is not supported yet",
        where=f"{source}/config.json",
        fix="build the original float checkpoint, with --quant int4|int8 for a quantized package",
    )


def looks_local(source: str) -> bool:
    """Whether ``source`` names a local path rather than a Hub id (``org/name``)."""
    if Path(source).expanduser().exists():
        return True
    return source.startswith(("/", ".", "~", "\\")) or source.count("/") > 1 or "\\" in source


def _tensor_types(checkpoint: Any) -> dict[str, Any]:
    """``{"tensor_types": {name: GGUF type}}`` of a GGUF checkpoint (``mobius inspect``
    shows them), else nothing."""
    from mobius.checkpoint.gguf import GGUFCheckpoint

    if not isinstance(checkpoint, GGUFCheckpoint):
        return {}
    return {"tensor_types": {n: t.ggml_type for n, t in sorted(checkpoint.tensors.items())}}


def source_to_dict(source: Any) -> dict[str, Any]:
    """A :class:`~mobius.checkpoint.SourceInfo` as a JSON-ready dict."""
    to_dict = getattr(source, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return {
        "source": source.source,
        "kind": source.kind,
        "revision": source.revision,
        "commit": source.commit,
        "files": dict(source.files),
    }


def versions(plugin_distribution: str | None, plugin_version: str | None) -> dict[str, str]:
    """Versions recorded in the manifest: core, the owning plugin, the ONNX libraries."""
    from importlib.metadata import PackageNotFoundError, version

    from mobius.plugins import CORE_DISTRIBUTION, core_version

    out = {CORE_DISTRIBUTION: core_version()}
    if plugin_distribution:
        out[plugin_distribution] = plugin_version or "unknown"
    for name in VERSIONED_LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def component_sizes(package: Path) -> dict[str, int]:
    """name → bytes of each component, from the written manifest."""
    import json

    from mobius.package import MANIFEST_NAME

    try:
        manifest = json.loads((package / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # the writer just wrote it: a bug if this fails
        raise MobiusError(
            f"cannot read the manifest just written: {exc}", where=str(package)
        ) from exc
    return {name: int(entry.get("size", 0)) for name, entry in manifest["components"].items()}


def _check_runtime_files(files: Any) -> None:
    """Refuse a checkpoint's broken tokenizer.json now, not when the package is first run."""
    from mobius.package.content import check_tokenizer_file

    for rf in files:
        if rf.path == "tokenizer.json" and rf.source is not None:
            check_tokenizer_file(
                Path(rf.source),
                fix="repair or replace the checkpoint's tokenizer.json (save it again with "
                "the tokenizers library) and build again",
            )


def _task(host: PluginHost, model_type: str) -> str:
    info = host.model_type_info(model_type)
    return info.tasks[0] if info.tasks else "text-generation"
