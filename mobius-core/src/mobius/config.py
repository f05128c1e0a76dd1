"""Reading ``config.json`` as plain JSON.

Core never asks transformers to parse a config: the file is read with ``json``,
``model_type`` picks the owning plugin, and that plugin turns the raw dict into
its typed config (``mobius_read_config``). This module only makes sure the user
gets a clear error (what / where / fix) for the ways the file can be wrong.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mobius.errors import ConfigError

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
GENERATION_CONFIG_KEY = "_generation_config"
"""Key of the raw config dict under which the runtime hands a family the package's
``generation_config.json`` object (see ``mobius_processors`` in ``hookspecs.py``)."""


def read_config_file(folder: str | Path) -> tuple[str, dict[str, Any]]:
    """Return ``(model_type, raw)`` from ``folder/config.json``.

    Raises :class:`ConfigError` for a missing folder, a missing or unreadable
    file, invalid JSON (with line and column), a top level that is not an
    object, and a missing or non-string ``model_type``.
    """
    root = Path(folder).expanduser()
    if not root.exists():
        raise ConfigError(
            f"checkpoint folder not found: {root}",
            where=str(root),
            fix="pass an existing folder holding config.json and *.safetensors, "
            "or a HuggingFace Hub id such as org/name",
        )
    if not root.is_dir():
        raise ConfigError(
            f"checkpoint source is a file, not a folder: {root}",
            where=str(root),
            fix="pass the folder that holds config.json, not a file inside it",
        )
    path = root / CONFIG_NAME
    if not path.is_file():
        raise ConfigError(
            f"no {CONFIG_NAME} in {root}",
            where=str(path),
            fix="pass the folder of a HuggingFace checkpoint (it holds config.json "
            "beside the *.safetensors files)",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read {CONFIG_NAME}: {exc}",
            where=str(path),
            fix="check the file's permissions and that it is UTF-8 text",
        ) from exc
    raw = parse_config_text(text, where=str(path))
    return model_type_of(raw, where=str(path)), raw


def parse_config_text(text: str, *, where: str) -> dict[str, Any]:
    """Parse the text of a config file into a dict, or raise :class:`ConfigError`."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{CONFIG_NAME} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            where=f"{where}:{exc.lineno}:{exc.colno}",
            fix="repair the file (or download it again)",
        ) from exc
    except (RecursionError, ValueError) as exc:
        # nesting deeper than the parser's recursion limit, or an integer longer
        # than Python's int-conversion limit: not a config any model has
        raise ConfigError(
            f"{CONFIG_NAME} cannot be parsed: {type(exc).__name__}: {str(exc)[:200]}",
            where=where,
            fix="repair the file (or download it again)",
        ) from exc
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{CONFIG_NAME} must hold a JSON object, found {type(raw).__name__}",
            where=where,
            fix="repair the file (or download it again)",
        )
    return raw


def model_type_of(raw: dict[str, Any], *, where: str) -> str:
    """``raw["model_type"]``, or :class:`ConfigError` when it is missing or not a string."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        found = "missing" if model_type is None else f"{model_type!r}"
        raise ConfigError(
            f"{CONFIG_NAME} has no usable model_type (found: {found})",
            where=f"{where}: model_type",
            fix="a HuggingFace config.json names its architecture in model_type, "
            'e.g. "gemma4"; check that this is a model checkpoint',
        )
    return model_type


def read_generation_config(path: str | Path | None) -> dict[str, Any] | None:
    """The JSON object in a ``generation_config.json`` (None when ``path`` is None or absent).

    The file only adds defaults (eos ids, sampling settings) to ``config.json``, so one
    that cannot be read or is not a JSON object is not fatal, but it is never dropped
    silently: a warning names the file and says what is lost.
    """
    if path is None:
        return None
    path = Path(path)
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        problem = f"cannot be read as JSON ({str(exc)[:200]})"
    else:
        if isinstance(raw, dict):
            return raw
        problem = f"holds a JSON {type(raw).__name__}, not an object"
    logging.getLogger(__name__).warning(
        "%s %s; its eos_token_id is not used as a stop id (config.json's are): "
        "fix or remove that file",
        path,
        problem,
    )
    return None


def generation_eos(source: str | Path | Mapping[str, Any] | None) -> Any:
    """The ``eos_token_id`` value of a generation config (None when there is none).

    ``source`` is a ``generation_config.json`` path (read by
    :func:`read_generation_config`, which names a malformed file in a warning) or a raw
    ``config.json`` dict, where the runtime attaches the package's generation config
    under :data:`GENERATION_CONFIG_KEY`. Build and run thus see the same ids.
    """
    if source is None or isinstance(source, (str, Path)):
        generation = read_generation_config(source)
    else:
        generation = source.get(GENERATION_CONFIG_KEY)
    return generation.get("eos_token_id") if isinstance(generation, dict) else None


def eos_ids(*sources: Any) -> tuple[int, ...]:
    """Every eos id the sources declare, in order, each once.

    A source is an int, a list of ints or None (HF writes ``eos_token_id`` in all three
    shapes); anything else in it (a bool, a string) is not an id and is skipped.
    """
    ids: list[int] = []
    for source in sources:
        for value in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(value, int) and not isinstance(value, bool):
                ids.append(value)
    return tuple(dict.fromkeys(ids))
