"""Golden files: what a reference run produced, stored exactly and with provenance.

Per case and level, ``<golden dir>/<case>.<level>.json``; the preprocessed media
arrays of the case's inputs sit beside it in ``<case>.inputs.npz`` (shared by L4
and L5, pinned by sha256 in both JSON files). Floats are written with
``float.hex`` so a golden round-trips bit-exactly and diffs stay readable; token
ids are plain ints. Every golden carries a provenance block (reference library
versions, device, dtype, revision, date), so a golden produced by another
transformers release is recognisable.

L4 (one prefill): top-1 id, top-k ids and logits, a summary (mean, std, min, max
of the last-position logits), the top-1/top-2 margin, and each prompt position's
top-1 and margin. L5: the greedy ids, their text (whole and per token), the
margin at each step and the stop ids used.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mobius.errors import MobiusError
from mobius.outdir import check_output_file, write_file

FORMAT = 1
MEDIA_SUFFIX = ".inputs.npz"


class GoldenError(MobiusError):
    """A golden file is missing, malformed, or does not match its inputs."""


def hexf(value: float) -> str:
    """A float as ``float.hex`` (exact)."""
    return float(value).hex()


def unhex(text: str | float) -> float:
    """Back from :func:`hexf` (plain numbers are accepted for hand-written goldens)."""
    return float.fromhex(text) if isinstance(text, str) else float(text)


def golden_path(golden_dir: Path, case_id: str, level: str) -> Path:
    return Path(golden_dir) / f"{case_id}.{level}.json"


def media_path(golden_dir: Path, case_id: str) -> Path:
    return Path(golden_dir) / f"{case_id}{MEDIA_SUFFIX}"


@dataclass(frozen=True)
class Inputs:
    """The exact inputs of a golden: token ids ``[S]`` and preprocessed media arrays by name."""

    input_ids: tuple[int, ...]
    media: Mapping[str, np.ndarray] = field(default_factory=dict)

    def media_sha256(self) -> str | None:
        return _npz_sha(self.media) if self.media else None


@dataclass(frozen=True)
class L4Golden:
    case: str
    inputs: Inputs
    vocab_size: int
    top_ids: tuple[int, ...]
    top_logits: tuple[float, ...]
    summary: Mapping[str, float]  # mean, std, min, max
    positions_top1: tuple[int, ...]
    positions_margin: tuple[float, ...]
    provenance: Mapping[str, Any]

    @property
    def top1(self) -> int:
        return self.top_ids[0]

    @property
    def margin(self) -> float:
        return self.top_logits[0] - self.top_logits[1]


@dataclass(frozen=True)
class L5Golden:
    case: str
    inputs: Inputs
    ids: tuple[int, ...]
    text: str
    pieces: tuple[str, ...]  # decoded text of each id alone
    margins: tuple[float, ...]  # top-1 minus top-2 at each step
    stop_ids: tuple[int, ...]
    stop_reason: str  # "stop_id" | "max_new_tokens"
    max_new_tokens: int
    provenance: Mapping[str, Any]


def l4_from_logits(
    case: str,
    inputs: Inputs,
    logits: np.ndarray,
    top_k: int,
    provenance: Mapping[str, Any],
) -> L4Golden:
    """An L4 golden from reference logits ``[S, V]`` (or ``[1, S, V]``) of one prefill."""
    all_pos = np.asarray(logits, dtype=np.float64)
    if all_pos.ndim == 3:
        all_pos = all_pos[0]
    last = all_pos[-1]
    order = np.argsort(-last, kind="stable")[:top_k]
    top2 = np.sort(all_pos, axis=-1)[:, -2:]
    return L4Golden(
        case=case,
        inputs=inputs,
        vocab_size=int(last.shape[0]),
        top_ids=tuple(int(i) for i in order),
        top_logits=tuple(float(last[i]) for i in order),
        summary=summary_of(last),
        positions_top1=tuple(int(i) for i in all_pos.argmax(axis=-1)),
        positions_margin=tuple(float(m) for m in top2[:, 1] - top2[:, 0]),
        provenance=dict(provenance),
    )


def summary_of(vector: np.ndarray) -> dict[str, float]:
    """mean, std, min, max of a logits vector, in float64."""
    v = np.asarray(vector, dtype=np.float64)
    return {
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(v.min()),
        "max": float(v.max()),
    }


# ---------------------------------------------------------------------- writing


def _header(golden_dir: Path, golden: L4Golden | L5Golden, kind: str) -> dict[str, Any]:
    """The fields every golden file starts with (the readers check format and kind first)."""
    return {
        "format": FORMAT,
        "kind": kind,
        "case": golden.case,
        "provenance": dict(golden.provenance),
        "inputs": _inputs_json(golden_dir, golden.case, golden.inputs),
    }


def write_l4(golden_dir: Path, golden: L4Golden) -> Path:
    data = {
        **_header(golden_dir, golden, "l4"),
        "vocab_size": golden.vocab_size,
        "top1": golden.top1,
        "margin": hexf(golden.margin),
        "top_k": {"ids": list(golden.top_ids), "logits": [hexf(x) for x in golden.top_logits]},
        "summary": {k: hexf(v) for k, v in golden.summary.items()},
        "positions": {
            "top1": list(golden.positions_top1),
            "margin": [hexf(x) for x in golden.positions_margin],
        },
    }
    return _write_json(golden_path(golden_dir, golden.case, "l4"), data)


def write_l5(golden_dir: Path, golden: L5Golden) -> Path:
    data = {
        **_header(golden_dir, golden, "l5"),
        "ids": list(golden.ids),
        "text": golden.text,
        "pieces": list(golden.pieces),
        "margins": [hexf(x) for x in golden.margins],
        "stop_ids": list(golden.stop_ids),
        "stop_reason": golden.stop_reason,
        "max_new_tokens": golden.max_new_tokens,
    }
    return _write_json(golden_path(golden_dir, golden.case, "l5"), data)


def _inputs_json(golden_dir: Path, case: str, inputs: Inputs) -> dict[str, Any]:
    out: dict[str, Any] = {"input_ids": list(inputs.input_ids), "media": None}
    if inputs.media:
        path = write_file(
            media_path(golden_dir, case),
            _npz_bytes(inputs.media),
            is_ours=is_media_file,
            what="golden media file",
        )
        out["media"] = {
            "file": path.name,
            "sha256": inputs.media_sha256(),
            "arrays": {
                k: {"shape": list(a.shape), "dtype": str(a.dtype)}
                for k, a in sorted(inputs.media.items())
            },
        }
    return out


def _write_json(path: Path, data: Mapping[str, Any]) -> Path:
    text = _dumps(data) + "\n"
    return write_file(path, text.encode("utf-8"), is_ours=is_golden_file, what="golden file")


def is_golden_file(path: Path) -> bool:
    """Whether ``path`` is a golden JSON file (so regenerating may overwrite it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "format" in data and data.get("kind") in ("l4", "l5")


def is_media_file(path: Path) -> bool:
    """Whether ``path`` is the media ``.npz`` a golden of its case names (so it may be replaced).

    Being a zip is not enough (any ``numpy.savez`` file, a user's archive renamed, is
    one): a previous golden of the same case in the same folder must name this file.
    """
    if not path.name.endswith(MEDIA_SUFFIX):
        return False
    case = path.name[: -len(MEDIA_SUFFIX)]
    try:
        with path.open("rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return False
    except OSError:
        return False
    for level in ("l4", "l5"):
        golden = golden_path(path.parent, case, level)
        if not is_golden_file(golden):
            continue
        data = json.loads(golden.read_text(encoding="utf-8"))
        media = (
            data.get("inputs", {}).get("media") if isinstance(data.get("inputs"), dict) else None
        )
        if isinstance(media, dict) and media.get("file") == path.name:
            return True
    return False


def check_golden_targets(golden_dir: Path, case_id: str, levels: Sequence[str]) -> None:
    """Refuse, before any work, golden paths whose writing would overwrite a user's file.

    The policy is :mod:`mobius.outdir`'s: only a previous golden is replaced, never
    a symbolic link, a folder or another file.
    """
    for level in levels:
        check_output_file(
            golden_path(golden_dir, case_id, level), is_ours=is_golden_file, what="golden file"
        )
    check_output_file(
        media_path(golden_dir, case_id), is_ours=is_media_file, what="golden media file"
    )


def _dumps(value: Any, indent: str = "") -> str:
    """JSON with one key per line but lists of scalars on one line (diff-friendly, compact)."""
    inner = indent + " "
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {_dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, (list, tuple)):
        if all(not isinstance(v, (Mapping, list, tuple)) for v in value):
            return "[" + ", ".join(json.dumps(v, ensure_ascii=False) for v in value) + "]"
        items = [inner + _dumps(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False)


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in sorted(arrays.items())})
    return buf.getvalue()


def _npz_sha(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over names, dtypes, shapes and bytes (not the zip container, which has dates)."""
    h = hashlib.sha256()
    for name, arr in sorted(arrays.items()):
        a = np.ascontiguousarray(arr)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------- reading


def read_l4(golden_dir: Path, case: str) -> L4Golden:
    path = golden_path(golden_dir, case, "l4")
    data = _read_json(path, "l4")
    try:
        top = data["top_k"]
        return L4Golden(
            case=data["case"],
            inputs=_read_inputs(path, data["inputs"]),
            vocab_size=int(data["vocab_size"]),
            top_ids=tuple(int(i) for i in top["ids"]),
            top_logits=tuple(unhex(x) for x in top["logits"]),
            summary={k: unhex(v) for k, v in data["summary"].items()},
            positions_top1=tuple(int(i) for i in data["positions"]["top1"]),
            positions_margin=tuple(unhex(x) for x in data["positions"]["margin"]),
            provenance=data.get("provenance", {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise GoldenError(
            f"L4 golden is malformed: {exc!r}", where=str(path), fix="regenerate it"
        ) from exc


def read_l5(golden_dir: Path, case: str) -> L5Golden:
    path = golden_path(golden_dir, case, "l5")
    data = _read_json(path, "l5")
    try:
        return L5Golden(
            case=data["case"],
            inputs=_read_inputs(path, data["inputs"]),
            ids=tuple(int(i) for i in data["ids"]),
            text=str(data["text"]),
            pieces=tuple(str(p) for p in data.get("pieces", ())),
            margins=tuple(unhex(x) for x in data.get("margins", ())),
            stop_ids=tuple(int(i) for i in data.get("stop_ids", ())),
            stop_reason=str(data.get("stop_reason", "max_new_tokens")),
            max_new_tokens=int(data["max_new_tokens"]),
            provenance=data.get("provenance", {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise GoldenError(
            f"L5 golden is malformed: {exc!r}", where=str(path), fix="regenerate it"
        ) from exc


def _read_json(path: Path, kind: str) -> dict[str, Any]:
    if not path.is_file():
        raise GoldenError(
            "golden file is missing", where=str(path), fix="run `mobius golden regen`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise GoldenError(f"golden is not JSON: {exc}", where=str(path)) from exc
    if data.get("format") != FORMAT or data.get("kind") != kind:
        raise GoldenError(
            f"expected a format-{FORMAT} {kind} golden, found format {data.get('format')!r} "
            f"kind {data.get('kind')!r}",
            where=str(path),
            fix="regenerate it with this mobius-testing",
        )
    return data


def _read_inputs(path: Path, data: Mapping[str, Any]) -> Inputs:
    ids = tuple(int(i) for i in data["input_ids"])
    media_info = data.get("media")
    if not media_info:
        return Inputs(ids)
    npz = path.parent / media_info["file"]
    if not npz.is_file():
        raise GoldenError(
            "the golden's media arrays are missing", where=str(npz), fix="regenerate the golden"
        )
    with np.load(npz, allow_pickle=False) as z:
        media = {k: z[k] for k in z.files}
    inputs = Inputs(ids, media)
    if inputs.media_sha256() != media_info.get("sha256"):
        raise GoldenError(
            "the media arrays do not match the sha256 stored in the golden",
            where=f"{npz} (referenced by {path})",
            fix="regenerate the golden; never edit the npz by hand",
        )
    return inputs


def same_inputs(a: Inputs, b: Inputs) -> bool:
    return tuple(a.input_ids) == tuple(b.input_ids) and a.media_sha256() == b.media_sha256()


def ids_array(ids: Sequence[int]) -> np.ndarray:
    return np.asarray(list(ids), dtype=np.int64)[None, :]
