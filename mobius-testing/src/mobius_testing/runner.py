"""Building, loading and checking: the harness side that never imports torch.

Packages are built with :func:`mobius.build` once per test session per
(source, revision, dtype, target) and loaded with :class:`mobius_runtime.Pipeline`
once per (package, device). The L4/L5 checks feed the golden's stored inputs
(ids and preprocessed media) through ``Pipeline.forward`` / ``Pipeline.generate``
only: the harness never wires sub-models; the package's contract does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mobius_testing.cases import Case
from mobius_testing.gates import (
    LOW_CONFIDENCE,
    PASS,
    GateResult,
    l4_gate,
    l5_gate,
    teacher_forced_ids,
    worst,
)
from mobius_testing.golden import L4Golden, L5Golden, ids_array

Builder = Callable[..., Any]
"""``builder(source, out, *, dtype, target, revision) -> record``: makes the package at
``out``; what it returns is kept in :attr:`BuildCache.records`."""


def mobius_build(
    source: str, out: Path, *, dtype: str | None, target: str, revision: str | None
) -> Any:
    """The default :data:`Builder`: :func:`mobius.build` in this process."""
    import mobius

    return mobius.build(source, out, dtype=dtype, target=target, revision=revision, force=True)


class BuildCache:
    """Packages keyed by (source, revision, dtype, target), built once under one folder.

    ``dtype`` None builds as ``mobius build`` without ``--dtype`` does (a GGUF file keeps
    its quantization). ``builder`` replaces how a package is made (e.g. a measured
    ``mobius build`` in a child process, so tests that check a build's memory and the
    golden cases share one build of each package)."""

    def __init__(self, root: Path, builder: Builder | None = None) -> None:
        self.root = Path(root)
        self.builder: Builder = builder or mobius_build
        self.records: dict[Path, Any] = {}
        self._built: dict[tuple[str, str | None, str | None, str], Path] = {}

    def build(
        self,
        source: str | Path,
        *,
        dtype: str | None = "f32",
        target: str = "default",
        revision: str | None = None,
    ) -> Path:
        """The package folder of ``source`` (built on first request)."""
        src = str(Path(source).resolve()) if Path(source).exists() else str(source)
        key = (src, revision, dtype, target)
        if key not in self._built:
            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
            out = self.root / f"{Path(src).name or 'model'}-{dtype or 'kept'}-{target}-{digest}"
            self.records[out] = self.builder(
                src, out, dtype=dtype, target=target, revision=revision
            )
            self._built[key] = out
        return self._built[key]

    def __len__(self) -> int:
        return len(self._built)


class PipelineCache:
    """Loaded pipelines keyed by (package folder, device)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._loaded: dict[tuple[str, str], Any] = {}

    def load(self, package: str | Path, device: str | None = None) -> Any:
        from mobius_runtime import Pipeline

        key = (str(Path(package).resolve()), device or self.device)
        if key not in self._loaded:
            self._loaded[key] = Pipeline.load(key[0], device=key[1])
        return self._loaded[key]


def golden_dir_for(case: Case, override: str | Path | None) -> Path:
    """``--golden-dir`` when given, else ``goldens/`` beside the case file."""
    return Path(override) if override else case.file.parent / "goldens"


def _decoder(pipeline: Any) -> Callable[[int], str] | None:
    text = getattr(pipeline, "text", None)
    if text is None or not hasattr(text, "decode"):
        return None
    return lambda tid: text.decode([tid])


def caller_feeds(
    pipeline: Any, media: Mapping[str, np.ndarray]
) -> tuple[dict[str, Any], list[str]]:
    """The stored media arrays the package takes as caller inputs, and the names it does not.

    The names come from the package's contract (external inputs of kind ``caller``).
    Arrays it does not declare are reported, never silently fed or silently dropped.
    """
    contract = getattr(pipeline, "contract", None)
    externals = getattr(contract, "externals", None)
    if externals is None:
        return dict(media), []
    accepted = {e.name for e in externals if getattr(e, "kind", "caller") == "caller"}
    feeds = {k: v for k, v in media.items() if k in accepted}
    return feeds, sorted(set(media) - accepted)


def check_l4(case: Case, golden: L4Golden, pipeline: Any) -> GateResult:
    """One prefill of the golden's inputs through the pipeline, gated by :func:`l4_gate`."""
    feeds, unused = caller_feeds(pipeline, golden.inputs.media)
    out = pipeline.forward(input_ids=ids_array(golden.inputs.input_ids), **feeds)
    result = l4_gate(golden, out["logits"], case.tolerances)
    if unused:
        result.notes.append(f"stored arrays the package does not take: {', '.join(unused)}")
    return result


def check_l5(case: Case, golden: L5Golden, pipeline: Any) -> GateResult:
    """Teacher-force the golden ids in one forward, and greedy-generate with the KV cache.

    The two views separate bugs: the teacher-forced argmax uses only the prefill
    path; ``generate`` runs the decode steps with carried state. Agreement of the
    first and divergence of the second points at the decode / KV-cache path.
    """
    decode = _decoder(pipeline)
    prompt = list(golden.inputs.input_ids)
    feeds, unused = caller_feeds(pipeline, golden.inputs.media)
    seq = prompt + list(golden.ids[:-1])
    out = pipeline.forward(input_ids=ids_array(seq), **feeds)
    forced = teacher_forced_ids(out["logits"], len(prompt), len(golden.ids))
    tf = l5_gate(golden, forced, case.tolerances, decode=decode, label="teacher-forced")
    results = [tf]
    if golden.inputs.media:
        results.append(
            GateResult(
                PASS,
                notes=[
                    "greedy generate skipped: generate() takes raw media, the golden stores "
                    "preprocessed arrays; the teacher-forced check covers this case"
                ],
            )
        )
    else:
        gen = pipeline.generate(
            input_ids=prompt,
            max_new_tokens=golden.max_new_tokens,
            do_sample=False,
            stop_ids=golden.stop_ids,
        )
        greedy = l5_gate(
            golden, list(gen.ids), case.tolerances, decode=decode, label="greedy generate"
        )
        if greedy.outcome != PASS and tf.outcome == PASS:
            greedy.notes.append(
                "the teacher-forced prefill agrees with the golden at every step: "
                "suspect the decode path (carried KV state, positions, masks)"
            )
        elif greedy.outcome == PASS and golden.text:
            greedy.notes.append(f"text: {gen.text!r}")
        results.append(greedy)
    merged = worst(*results)
    if unused:
        merged.notes.append(f"stored arrays the package does not take: {', '.join(unused)}")
    return merged


__all__ = [
    "LOW_CONFIDENCE",
    "BuildCache",
    "Builder",
    "PipelineCache",
    "caller_feeds",
    "check_l4",
    "check_l5",
    "golden_dir_for",
    "mobius_build",
]
