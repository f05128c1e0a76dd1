"""Golden case files: TOML, validated against a small schema with errors naming file and field.

A family declares its L4/L5 cases as ``*.case.toml`` files in a folder of its
tests (the pytest plugin collects them wherever pytest looks) or through the
``mobius_testing.cases`` entry-point group (``mobius golden check``). TOML is
read with the standard library (``tomllib``, Python 3.11+; ``tomli`` before), so
the harness adds no YAML dependency.

Schema (every key not listed is an error, so a typo never silently does nothing)::

    family = "gemma4"                  # required: the family the case belongs to (--families)
    model = "google/gemma-4-E2B-it"    # exactly one of model (Hub id), path (folder,
    path = "../../testdata/tiny"       #   relative to the case file) or gguf (a file name,
    gguf = "model.Q4_1.gguf"           #   looked up in the real-model folders, see below)
    revision = "<40 hex>"              # required with model: the pinned commit, or "unpinned"
    sha256 = "<64 hex>"                # required with gguf: the file's pinned sha256
    task = "text-generation"           # one of TASKS
    dtype = "f32"                      # build dtype: f32 | f16 | bf16; a gguf case may leave
                                       #   it out: the package keeps the file's quantization
    reference_dtype = "f32"            # optional: the dtype HF's reference runs in for regen
    target = "default"                 # optional build target: default | cpu | cuda
    levels = ["l4", "l5"]              # which goldens the case has
    size = "small"                     # optional shard: tiny | small | medium | large
    gpu = true                         # optional: needs --device cuda (default: true for model)
    skip = "reason"                    # optional: always skipped with that reason
    [inputs]
    prompt = "..."                     # required
    chat = true                        # optional: apply the chat template (default true)
    images = ["media/cat.png"]         # optional, relative to the case file
    audio = ["media/speech.wav"]       # optional, relative to the case file
    [tolerances]                       # optional; defaults depend on dtype (DEFAULT_TOLERANCES)
    top_k = 10
    logits_atol = 0.02
    logits_rtol = 0.0
    summary_atol = 0.05
    min_margin = 0.05
    [l5]
    max_new_tokens = 16                # optional, default 16

``revision = "unpinned"`` is the explicit "we could not pin a commit" policy: such a
case is collected and listed, and always skips with the reason "no pinned revision /
weights unavailable" until someone pins a commit and regenerates its goldens.

A ``gguf`` case is pinned by the file's sha256. The file is looked up by name in the
folders ``$MOBIUS_REAL_MODELS`` and ``$MOBIUS_REAL_CACHE`` name (``tox -e real-<family>``
sets both and fetches the file, ``.ci/fetch_real.py``). A file found there with another
sha256 is an error, never a skip. A file found nowhere skips the case with a reason
saying how to get it, unless ``$MOBIUS_REAL_REQUIRED`` is set (the real envs set it):
then it is an error too, so an env whose job is to run these cases cannot pass having
run none of them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mobius.errors import MobiusError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

CASE_SUFFIX = ".case.toml"
TASKS = ("text-generation", "image-text-to-text", "audio-text-to-text", "any-to-any")
DTYPES = ("f32", "f16", "bf16")
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
"""A case dtype as torch names it (the reference's ``reference_dtype`` in provenance)."""
TARGETS = ("default", "cpu", "cuda")
LEVELS = ("l4", "l5")
SIZES = ("tiny", "small", "medium", "large")
UNPINNED = "unpinned"
REAL_FOLDERS = ("MOBIUS_REAL_MODELS", "MOBIUS_REAL_CACHE")
"""Environment variables naming the folders a ``gguf`` case's file is looked up in."""
REAL_REQUIRED = "MOBIUS_REAL_REQUIRED"
"""Set (non-empty) where a ``gguf`` case's file must be present: the real tox envs."""
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GGUF_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*\.gguf$")
_CASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

DEFAULT_TOLERANCES: Mapping[str, Mapping[str, float]] = {
    "f32": {
        "top_k": 10,
        "logits_atol": 0.02,
        "logits_rtol": 0.0,
        "summary_atol": 0.02,
        "min_margin": 0.05,
    },
    "f16": {
        "top_k": 10,
        "logits_atol": 0.25,
        "logits_rtol": 0.01,
        "summary_atol": 0.1,
        "min_margin": 0.3,
    },
    "bf16": {
        "top_k": 10,
        "logits_atol": 0.5,
        "logits_rtol": 0.02,
        "summary_atol": 0.25,
        "min_margin": 0.6,
    },
}
"""Defaults against an fp32 reference: the package's dtype sets how far it may drift."""

_TOP_KEYS = {
    "family",
    "model",
    "path",
    "gguf",
    "revision",
    "sha256",
    "task",
    "dtype",
    "reference_dtype",
    "target",
    "levels",
    "size",
    "gpu",
    "skip",
    "inputs",
    "tolerances",
    "l5",
}
_INPUT_KEYS = {"prompt", "chat", "images", "audio"}
_TOL_KEYS = {"top_k", "logits_atol", "logits_rtol", "summary_atol", "min_margin"}
_L5_KEYS = {"max_new_tokens"}


class CaseError(MobiusError):
    """A case file is unreadable or does not match the case schema."""


@dataclass(frozen=True)
class Tolerances:
    """How far a package's logits may be from the golden, and when a golden is too close to call."""

    top_k: int
    logits_atol: float
    logits_rtol: float
    summary_atol: float
    min_margin: float


@dataclass(frozen=True)
class Case:
    """One validated case file."""

    id: str
    file: Path
    family: str
    source: str  # Hub id, absolute folder path, or the GGUF file name
    local: bool
    revision: str | None  # 40-hex commit; None for local folders, GGUF and "unpinned" cases
    task: str
    dtype: str | None  # None: a GGUF case keeping the file's quantization
    target: str
    levels: tuple[str, ...]
    size: str
    gpu: bool
    skip: str | None
    prompt: str
    chat: bool
    images: tuple[Path, ...]
    audio: tuple[Path, ...]
    tolerances: Tolerances
    max_new_tokens: int
    gguf_sha256: str | None = None  # set for a GGUF case (source is then the file name)
    reference_dtype: str = "f32"
    raw: Mapping[str, Any] = field(repr=False, default_factory=dict)

    @property
    def gguf(self) -> bool:
        return self.gguf_sha256 is not None

    @property
    def unpinned(self) -> bool:
        return not self.local and not self.gguf and self.revision is None

    @property
    def dtype_label(self) -> str:
        """The build dtype, or ``kept`` for a GGUF case keeping its quantization."""
        return self.dtype or "kept"

    def build_source(self) -> str:
        """What to build: the Hub id, the folder, or the located and checked GGUF file."""
        if not self.gguf:
            return self.source
        path = locate_gguf(self)
        if path is None:
            raise CaseError(
                f"GGUF file {self.source} was not found ({_where_looked()})",
                where=str(self.file),
                fix=_how_to_get(self),
            )
        return str(path)

    def skip_reason(self) -> str | None:
        """Why this case cannot run whatever the machine, or None.

        A GGUF case whose file is present with another sha256, or absent where
        ``$MOBIUS_REAL_REQUIRED`` is set, raises :class:`CaseError` instead."""
        if self.skip:
            return self.skip
        if self.gguf and locate_gguf(self) is None:
            what = f"GGUF file {self.source} is not here ({_where_looked()})"
            if os.environ.get(REAL_REQUIRED):
                raise CaseError(
                    f"{what} but ${REAL_REQUIRED} is set: this env must run the case",
                    where=str(self.file),
                    fix=_how_to_get(self),
                )
            return f"{what}; to run it: {_how_to_get(self)}"
        if self.unpinned:
            return (
                f"no pinned revision / weights unavailable for {self.source} "
                f"(case {self.file.name} says revision = {UNPINNED!r}; pin a 40-hex commit "
                "and run `mobius golden regen` on a machine with the weights)"
            )
        if self.local and not Path(self.source).is_dir():
            return f"checkpoint folder {self.source} does not exist (weights unavailable)"
        for media in (*self.images, *self.audio):
            if not media.is_file():
                return f"media file {media} is missing"
        return None


def real_folders() -> list[Path]:
    """The folders named by :data:`REAL_FOLDERS` that are set, in that order."""
    return [Path(os.environ[v]) for v in REAL_FOLDERS if os.environ.get(v)]


def locate_gguf(case: Case) -> Path | None:
    """The GGUF file of ``case`` in the real-model folders, its sha256 checked; None when
    absent. A file of that name with another sha256 raises :class:`CaseError`."""
    for folder in real_folders():
        path = (folder / case.source).resolve()
        if not path.is_file():
            continue
        stat = path.stat()
        got = file_sha256(path, stat.st_size, stat.st_mtime_ns)
        if got != case.gguf_sha256:
            raise CaseError(
                f"GGUF file has sha256 {got}, the case pins {case.gguf_sha256}",
                where=f"{path} (case {case.file})",
                fix="delete the file and fetch it again (tox -e real-"
                f"{case.family} does); if the case's pin is outdated, re-pin it and run "
                "`mobius golden regen` on the new file",
            )
        return path
    return None


@functools.lru_cache(maxsize=16)
def file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    """sha256 of a file, cached per (path, size, mtime) so a session hashes it once."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _where_looked() -> str:
    looked = [f"${v}={os.environ[v]}" for v in REAL_FOLDERS if os.environ.get(v)]
    return (
        "looked in " + ", ".join(looked)
        if looked
        else " and ".join(f"${v}" for v in REAL_FOLDERS) + " are unset"
    )


def _how_to_get(case: Case) -> str:
    return (
        f"run `tox -e real-{case.family}` (it fetches {case.source} and sets "
        f"{' / '.join(REAL_FOLDERS)}), or put the file (sha256 {case.gguf_sha256}) in a "
        f"folder and set {REAL_FOLDERS[0]} to it"
    )


def case_id_of(file: Path) -> str:
    name = file.name
    return name[: -len(CASE_SUFFIX)] if name.endswith(CASE_SUFFIX) else file.stem


def load_case(file: str | Path) -> Case:
    """Read and validate one case file; :class:`CaseError` names the file and the field."""
    path = Path(file).resolve()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseError(
            f"cannot read case file: {exc}", where=str(path), fix="check the path"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise CaseError(
            f"case file is not valid TOML: {exc}", where=str(path), fix="fix the TOML syntax"
        ) from exc
    return validate_case(raw, path)


def validate_case(raw: Mapping[str, Any], path: Path) -> Case:
    """Check ``raw`` (parsed TOML of ``path``) against the schema and build a :class:`Case`."""
    v = _Validator(path)
    v.no_unknown(raw, _TOP_KEYS, "")
    case_id = case_id_of(path)
    if not _CASE_ID.match(case_id):
        v.fail("", f"case id {case_id!r} (from the file name) has odd characters", "rename it")
    family = v.string(raw, "family", required=True)
    model = v.string(raw, "model")
    folder = v.string(raw, "path")
    gguf_name = v.string(raw, "gguf")
    if sum(x is not None for x in (model, folder, gguf_name)) != 1:
        v.fail(
            "model",
            "exactly one of 'model' (Hub id), 'path' (local folder) or 'gguf' (GGUF file "
            "name) is required",
        )
    if gguf_name is None and "sha256" in raw:
        v.fail("sha256", "only a 'gguf' case has a sha256", "remove 'sha256' or use 'gguf'")
    revision: str | None = None
    gguf_sha: str | None = None
    if gguf_name is not None:
        if not _GGUF_NAME.match(gguf_name):
            v.fail(
                "gguf",
                f"{gguf_name!r} is not a plain .gguf file name",
                "name the file only (no folder, no '..'): it is looked up in "
                f"${REAL_FOLDERS[0]} / ${REAL_FOLDERS[1]}",
            )
        if "revision" in raw:
            v.fail("revision", "a 'gguf' case is pinned by its sha256", "remove 'revision'")
        gguf_sha = v.string(raw, "sha256", required=True)
        if gguf_sha is None or not _SHA256.match(gguf_sha):
            v.fail("sha256", f"{gguf_sha!r} is not a sha256", "write the file's sha256 "
                   "(64 lowercase hex digits, `sha256sum FILE`)")  # fmt: skip
        source, local = str(gguf_name), False
    elif model is not None:
        if "/" not in model:
            v.fail("model", f"{model!r} is not a Hub id of the form owner/name")
        rev = v.string(raw, "revision", required=True)
        if rev == UNPINNED:
            revision = None
        elif rev is None or not _COMMIT.match(rev):
            v.fail(
                "revision",
                f"{rev!r} is not a 40-hex commit",
                f"pin the exact commit (40 lowercase hex digits), or write {UNPINNED!r} "
                "to mark the case as not runnable until it is pinned",
            )
        else:
            revision = rev
        source, local = model, False
    else:
        if "revision" in raw:
            v.fail("revision", "a local 'path' case has no revision", "remove 'revision'")
        source, local = str((path.parent / str(folder)).resolve()), True
    task = v.choice(raw, "task", TASKS, required=True)
    dtype = v.choice(raw, "dtype", DTYPES, required=gguf_sha is None)
    reference_dtype = v.choice(raw, "reference_dtype", DTYPES) or "f32"
    target = v.choice(raw, "target", TARGETS) or "default"
    levels_raw = v.get(raw, "levels", list, required=True)
    levels = []
    for i, level in enumerate(levels_raw):
        if level not in LEVELS:
            v.fail(f"levels[{i}]", f"{level!r} is not one of {', '.join(LEVELS)}")
        if level in levels:
            v.fail(f"levels[{i}]", f"{level!r} is listed twice")
        levels.append(level)
    if not levels:
        v.fail("levels", "no level listed", f"list one or more of {', '.join(LEVELS)}")
    size = v.choice(raw, "size", SIZES) or ("tiny" if local else "small")
    gpu = v.get(raw, "gpu", bool)
    skip = v.string(raw, "skip")

    inputs = v.get(raw, "inputs", dict, required=True)
    v.no_unknown(inputs, _INPUT_KEYS, "inputs")
    prompt = v.string(inputs, "prompt", required=True, prefix="inputs")
    chat = v.get(inputs, "chat", bool, prefix="inputs")
    images = _media(v, inputs, "images", path)
    audio = _media(v, inputs, "audio", path)
    if images and task not in ("image-text-to-text", "any-to-any"):
        v.fail("inputs.images", f"task {task!r} takes no images", "use task image-text-to-text")
    if audio and task not in ("audio-text-to-text", "any-to-any"):
        v.fail("inputs.audio", f"task {task!r} takes no audio", "use task audio-text-to-text")

    tol_raw = v.get(raw, "tolerances", dict) or {}
    v.no_unknown(tol_raw, _TOL_KEYS, "tolerances")
    tol = dict(DEFAULT_TOLERANCES[dtype or "f32"])
    for key, value in tol_raw.items():
        kind = int if key == "top_k" else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or value < 0:
            v.fail(f"tolerances.{key}", f"{value!r} is not a non-negative number")
        tol[key] = value
    if tol["top_k"] < 2:
        v.fail("tolerances.top_k", "top_k must be at least 2 (the margin needs top-2)")

    l5 = v.get(raw, "l5", dict) or {}
    v.no_unknown(l5, _L5_KEYS, "l5")
    max_new = l5.get("max_new_tokens", 16)
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        v.fail("l5.max_new_tokens", f"{max_new!r} is not a positive integer")

    return Case(
        id=case_id,
        file=path,
        family=str(family),
        source=source,
        local=local,
        revision=revision,
        task=str(task),
        dtype=dtype,
        target=str(target),
        levels=tuple(levels),
        size=str(size),
        gpu=(not local and gguf_sha is None) if gpu is None else gpu,
        skip=skip,
        prompt=str(prompt),
        chat=True if chat is None else chat,
        images=images,
        audio=audio,
        tolerances=Tolerances(
            top_k=int(tol["top_k"]),
            logits_atol=float(tol["logits_atol"]),
            logits_rtol=float(tol["logits_rtol"]),
            summary_atol=float(tol["summary_atol"]),
            min_margin=float(tol["min_margin"]),
        ),
        max_new_tokens=int(max_new),
        gguf_sha256=gguf_sha,
        reference_dtype=str(reference_dtype),
        raw=dict(raw),
    )


def _media(v: _Validator, inputs: Mapping[str, Any], key: str, path: Path) -> tuple[Path, ...]:
    items = v.get(inputs, key, list, prefix="inputs") or []
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            v.fail(f"inputs.{key}[{i}]", f"{item!r} is not a file path")
        out.append((path.parent / item).resolve())
    return tuple(out)


class _Validator:
    """Field checks that raise :class:`CaseError` naming the file and the dotted field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field_name: str, what: str, fix: str | None = None) -> None:
        where = f"{self.path}: field '{field_name}'" if field_name else str(self.path)
        raise CaseError(what, where=where, fix=fix or "see the schema in mobius_testing/cases.py")

    def no_unknown(self, table: Mapping[str, Any], allowed: set[str], prefix: str) -> None:
        for key in table:
            if key not in allowed:
                name = f"{prefix}.{key}" if prefix else key
                self.fail(name, "unknown field", f"allowed here: {', '.join(sorted(allowed))}")

    def get(
        self,
        table: Mapping[str, Any],
        key: str,
        kind: type,
        *,
        required: bool = False,
        prefix: str = "",
    ) -> Any:
        name = f"{prefix}.{key}" if prefix else key
        if key not in table:
            if required:
                self.fail(name, "required field is missing")
            return None
        value = table[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            self.fail(name, f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return value

    def string(
        self, table: Mapping[str, Any], key: str, *, required: bool = False, prefix: str = ""
    ) -> str | None:
        value = self.get(table, key, str, required=required, prefix=prefix)
        if value is not None and not value.strip():
            self.fail(f"{prefix}.{key}" if prefix else key, "must not be empty")
        return value

    def choice(
        self, table: Mapping[str, Any], key: str, allowed: Iterable[str], *, required: bool = False
    ) -> str | None:
        value = self.string(table, key, required=required)
        allowed = tuple(allowed)
        if value is not None and value not in allowed:
            self.fail(key, f"{value!r} is not one of {', '.join(allowed)}")
        return value


def find_cases(paths: Iterable[str | Path]) -> list[Path]:
    """Case files among ``paths`` (files, or folders searched recursively), sorted."""
    found: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found.extend(sorted(path.rglob(f"*{CASE_SUFFIX}")))
        elif path.is_file():
            found.append(path)
        else:
            raise CaseError("no such case file or folder", where=str(path), fix="check the path")
    return found
