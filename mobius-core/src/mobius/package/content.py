"""Reading the JSON files of a package (or of a checkpoint) as untrusted input.

A package is downloaded from strangers, so every JSON file in it is parsed with
bounds and turned into a :class:`PackageError` (never a traceback) when it is not
what the runtime relies on: too large, not UTF-8, not JSON, nested too deeply
(Python raises RecursionError), an integer of thousands of digits (ValueError),
duplicated object keys (``json`` would silently keep the last one), or the wrong
schema. The same checks run on a checkpoint's ``tokenizer.json`` before a build
copies it, so a broken tokenizer is refused at build time, not at run time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mobius.errors import PackageError

MAX_MANIFEST_BYTES = 64 * 1024 * 1024
"""mobius.json of a real package is a few kB (plus the embedded config.json)."""
MAX_JSON_BYTES = 1024 * 1024 * 1024
"""Largest tokenizer.json / config.json read (real tokenizers are tens of MB)."""
MAX_DEPTH = 64
"""Deepest nesting of arrays/objects accepted in any package JSON file."""
TOKENIZER_MODELS = ("BPE", "WordPiece", "WordLevel", "Unigram")
"""``model.type`` values of the HuggingFace ``tokenizers`` JSON format."""


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, iteratively (no recursion), stopping past ``limit``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def load_json(path: Path, what: str, fix: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse the JSON file ``path`` (named ``what`` in errors) or raise PackageError.

    The size is compared with ``max_bytes`` before anything is read; a FIFO or a
    device is refused without being opened for reading.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise PackageError(
            f"{what} cannot be read: {exc.strerror or exc}", where=str(path), fix=fix
        ) from exc
    if not _regular(info.st_mode):
        raise PackageError(f"{what} is not a regular file", where=str(path), fix=fix)
    if info.st_size > max_bytes:
        raise PackageError(
            f"{what} is {info.st_size} bytes, more than the {max_bytes} this reader accepts",
            where=str(path),
            fix=fix,
        )
    try:
        text = path.read_bytes().decode("utf-8")
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except OSError as exc:
        raise PackageError(
            f"{what} cannot be read: {exc.strerror or exc}", where=str(path), fix=fix
        ) from exc
    except UnicodeDecodeError as exc:
        raise PackageError(f"{what} is not UTF-8 text ({exc})", where=str(path), fix=fix) from exc
    except RecursionError as exc:
        raise PackageError(
            f"{what} is nested too deeply to be a real file", where=str(path), fix=fix
        ) from exc
    except ValueError as exc:  # JSONDecodeError, duplicate keys, integers of >4300 digits
        raise PackageError(f"{what} is not valid JSON ({exc})", where=str(path), fix=fix) from exc
    if _depth(value, MAX_DEPTH) > MAX_DEPTH:
        raise PackageError(
            f"{what} nests arrays/objects more than {MAX_DEPTH} deep", where=str(path), fix=fix
        )
    return value


def _regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


def tokenizer_problems(tokenizer: Any) -> list[str]:
    """What makes a parsed ``tokenizer.json`` unusable by the ``tokenizers`` library.

    Checks the schema the library needs to load it (a ``model`` object of a known
    type with its vocabulary, ``added_tokens`` entries with an int id and a string).
    """
    if not isinstance(tokenizer, dict):
        return ["is not a JSON object"]
    problems: list[str] = []
    model = tokenizer.get("model")
    if not isinstance(model, dict):
        return ["has no 'model' object"]
    kind = model.get("type")
    if kind is not None and kind not in TOKENIZER_MODELS:
        problems.append(f"model.type {kind!r} is none of {', '.join(TOKENIZER_MODELS)}")
    vocab = model.get("vocab")
    if kind == "Unigram" or (kind is None and isinstance(vocab, list)):
        if not isinstance(vocab, list) or not all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) for v in vocab
        ):
            problems.append("model.vocab is not a list of [token, score] pairs")
    elif not isinstance(vocab, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in vocab.values()
    ):
        problems.append("model.vocab is not an object of token -> integer id")
    if kind == "BPE" and not isinstance(model.get("merges"), list):
        problems.append("model.merges (BPE) is not a list")
    added = tokenizer.get("added_tokens", [])
    if not isinstance(added, list) or not all(
        isinstance(t, dict)
        and isinstance(t.get("id"), int)
        and not isinstance(t.get("id"), bool)
        and isinstance(t.get("content"), str)
        for t in added
    ):
        problems.append("added_tokens is not a list of {id: int, content: str}")
    return problems


def check_tokenizer_file(path: Path, fix: str) -> None:
    """Raise PackageError when the tokenizer.json at ``path`` cannot be loaded."""
    what = "tokenizer.json"
    problems = tokenizer_problems(load_json(path, what, fix))
    if problems:
        raise PackageError(f"{what} {'; '.join(problems)}", where=str(path), fix=fix)
