"""Checked readers for single ``config.json`` values: the right JSON type, in range, or a ConfigError.

config.json is user input. Reading it with ``int()`` / ``float()`` / ``.get()`` lets a
wrong type escape as TypeError, AttributeError or ZeroDivisionError, and lets an absurd
size (``num_hidden_layers: 2**62``) make a later loop or allocation run away. Every
family's config reader (Gemma 4 text, vision, audio; Qwen3) takes its raw values through
these functions, which raise :class:`~mobius.errors.ConfigError` naming the full key path
(``where.key``), what was expected and what was found.

Booleans are not integers here: ``true`` never passes as a size of 1. Integers pass
where a float is expected (``rope_theta: 10000``). Sizes have generous but finite upper
bounds (``MAX_*``) so that no config can claim a size no real checkpoint could have.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from mobius.errors import ConfigError

MAX_LAYERS = 4096
"""Most layers any stack may claim (the largest Gemma 4 has 60, Qwen3-235B 94)."""
MAX_WIDTH = 1 << 20
"""Most channels of one width: hidden, intermediate, head_dim, PLE, projections."""
MAX_HEADS = 4096
"""Most attention heads (query or KV) per layer."""
MAX_VOCAB = 1 << 24
"""Most vocabulary entries (Gemma 4 has 262 144)."""
MAX_POSITIONS = 1 << 24
"""Most positions: max_position_embeddings, sliding_window, position tables."""
MAX_EXPERTS = 4096
"""Most MoE experts (Gemma 4 26B-A4B and Qwen3-30B-A3B have 128)."""
MAX_TOKEN_ID = (1 << 31) - 1
"""Token ids travel as int32/int64 tensors and JSON numbers; keep them in int32."""
MAX_KERNEL = 1 << 12
"""Most taps of a spatial or temporal kernel (patch, pooling, conv, attention chunk)."""
MAX_LIST = MAX_LAYERS
"""Longest list value read (layer_types has one entry per layer)."""

_MISSING: Any = object()
T = TypeVar("T")


def show(value: Any) -> str:
    """A short, always-printable rendering of a bad value (repr of a huge int can raise)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<integer of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return names.get(type(value), type(value).__name__)


def path(where: str, key: str | int) -> str:
    """The key path shown in errors: ``config.json.text_config.rope_parameters``."""
    return f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}"


def fail(what: str, where: str, fix: str) -> ConfigError:
    """A ConfigError with what / where / fix (a tiny helper so call sites stay one line)."""
    return ConfigError(what, where=where, fix=fix)


def read_section(
    raw: Any, section: str, where: str, read: Callable[[Mapping[str, Any], str, str], T]
) -> T:
    """Read one sub-config object (``vision_config``, ``audio_config``) with ``read``.

    ``read(raw, where, at)`` gets ``at``, the section's path for the checked readers
    (``where`` may already end in the section's name). A section that is not an object,
    and any wrong-typed value that escapes ``read`` as TypeError, ValueError or
    OverflowError, become ConfigErrors naming the section, never bare exceptions.
    """
    try:
        if not isinstance(raw, Mapping):
            raise fail(
                f"{section} is not a JSON object",
                where,
                f"the checkpoint's config.json must hold {section} as an object",
            )
        at = where if where.endswith(section) else f"{where}: {section}"
        return read(raw, where, at)
    except (TypeError, ValueError, OverflowError) as e:
        raise fail(
            f"{section} has a value of the wrong type: {e}",
            f"{where}: {section}",
            "use numbers for sizes and strings for names, as HF's config.json does",
        ) from e


def _key(where: str) -> str:
    """The last key of a path, to start a message: ``...full_attention.rope_theta`` → ``rope_theta``."""
    return where.rsplit(".", 1)[-1].rsplit(": ", 1)[-1]


def is_int(value: Any) -> bool:
    """A JSON integer (``true`` / ``false`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _get(raw: Mapping[str, Any], key: str, default: Any) -> Any:
    """``raw[key]``, or ``default`` when the key is absent or null (HF treats null as unset)."""
    value = raw.get(key, _MISSING)
    return default if value is _MISSING or value is None else value


def check_int(value: Any, where: str, *, minimum: int, maximum: int) -> int:
    """``value`` itself as an integer in ``[minimum, maximum]``, else a ConfigError at ``where``."""
    if not is_int(value):
        raise fail(
            f"{_key(where)}: expected an integer, got {_type_name(value)} {show(value)}",
            where,
            f"set it to an integer between {minimum} and {maximum}",
        )
    if value < minimum:
        raise fail(
            f"{_key(where)}: expected an integer >= {minimum}, got {show(value)}",
            where,
            f"set it to an integer between {minimum} and {maximum}",
        )
    if value > maximum:
        raise fail(
            f"{_key(where)}: {show(value)} is above mobius's limit of {maximum}",
            where,
            f"use at most {maximum}: no real checkpoint is this large, and mobius refuses larger "
            "values so a broken config cannot make it loop or allocate without end",
        )
    return value


def integer(
    raw: Mapping[str, Any],
    key: str,
    default: int,
    where: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_WIDTH,
) -> int:
    """``raw[key]`` as an integer in ``[minimum, maximum]``; absent or null → ``default``."""
    return check_int(_get(raw, key, default), path(where, key), minimum=minimum, maximum=maximum)


def positive_int(
    raw: Mapping[str, Any], key: str, default: int, where: str, *, maximum: int = MAX_WIDTH
) -> int:
    """A size that must be at least 1 (widths, head counts, layer counts)."""
    return integer(raw, key, default, where, minimum=1, maximum=maximum)


def nonneg_int(
    raw: Mapping[str, Any], key: str, default: int, where: str, *, maximum: int = MAX_WIDTH
) -> int:
    """A count or id that may be 0."""
    return integer(raw, key, default, where, minimum=0, maximum=maximum)


def optional_int(
    raw: Mapping[str, Any], key: str, where: str, *, minimum: int = 0, maximum: int = MAX_WIDTH
) -> int | None:
    """An integer that may be absent or null (→ ``None``)."""
    value = raw.get(key)
    if value is None:
        return None
    return check_int(value, path(where, key), minimum=minimum, maximum=maximum)


def check_float(
    value: Any,
    where: str,
    *,
    positive: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """``value`` as a finite float (integers allowed), optionally > 0 and within bounds."""
    bounds = []
    if positive:
        bounds.append("> 0")
    if minimum is not None:
        bounds.append(f">= {minimum}")
    if maximum is not None:
        bounds.append(f"<= {maximum}")
    want = "a finite number" + (" " + " and ".join(bounds) if bounds else "")
    if not (is_int(value) or isinstance(value, float)):
        raise fail(
            f"{_key(where)}: expected {want}, got {_type_name(value)} {show(value)}",
            where,
            f"set it to {want}",
        )
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if (
        not math.isfinite(number)
        or (positive and number <= 0)
        or (minimum is not None and number < minimum)
        or (maximum is not None and number > maximum)
    ):
        raise fail(f"{_key(where)}: expected {want}, got {show(value)}", where, f"set it to {want}")
    return number


def finite_float(
    raw: Mapping[str, Any],
    key: str,
    default: float,
    where: str,
    *,
    positive: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """``raw[key]`` as a finite float; absent or null → ``default``."""
    return check_float(
        _get(raw, key, default),
        path(where, key),
        positive=positive,
        minimum=minimum,
        maximum=maximum,
    )


def optional_float(
    raw: Mapping[str, Any], key: str, where: str, *, positive: bool = False
) -> float | None:
    """A finite float that may be absent or null (→ ``None``), e.g. a soft-cap that is off."""
    value = raw.get(key)
    if value is None:
        return None
    return check_float(value, path(where, key), positive=positive)


def boolean(raw: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    """A JSON ``true`` / ``false``; absent or null → ``default``. Strings and numbers are refused."""
    value = _get(raw, key, default)
    if not isinstance(value, bool):
        raise fail(
            f"{key}: expected true or false, got {_type_name(value)} {show(value)}",
            path(where, key),
            "set it to true or false",
        )
    return value


def string(
    raw: Mapping[str, Any],
    key: str,
    default: str,
    where: str,
    *,
    choices: Sequence[str] | None = None,
) -> str:
    """A JSON string, optionally one of ``choices``; absent or null → ``default``."""
    value = _get(raw, key, default)
    if not isinstance(value, str):
        raise fail(
            f"{key}: expected a string, got {_type_name(value)} {show(value)}",
            path(where, key),
            f"use one of {', '.join(choices)}" if choices else "set it to a string",
        )
    if choices is not None and value not in choices:
        raise fail(
            f"{key}: unsupported value {show(value)}",
            path(where, key),
            f"use one of {', '.join(choices)}",
        )
    return value


def mapping(raw: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    """A JSON object, or ``None`` when absent or null."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise fail(
            f"{key}: expected an object, got {_type_name(value)} {show(value)}",
            path(where, key),
            f"make {key} a JSON object (or remove it to use the defaults)",
        )
    return value


def _list(raw: Mapping[str, Any], key: str, where: str, *, max_len: int, scalar: bool) -> Any:
    value = raw.get(key)
    if value is None:
        return None
    if scalar and not isinstance(value, (list, tuple)):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise fail(
            f"{key}: expected a list, got {_type_name(value)} {show(value)}",
            path(where, key),
            f"make {key} a JSON list",
        )
    if len(value) > max_len:
        raise fail(
            f"{key}: list has {len(value)} entries, above mobius's limit of {max_len}",
            path(where, key),
            "no real checkpoint has a list this long; fix config.json",
        )
    return value


def int_list(
    raw: Mapping[str, Any],
    key: str,
    where: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_WIDTH,
    max_len: int = MAX_LIST,
    scalar: bool = False,
) -> tuple[int, ...] | None:
    """A list of bounded integers (``scalar``: a lone integer counts as a list of one);
    ``None`` when absent or null."""
    items = _list(raw, key, where, max_len=max_len, scalar=scalar)
    if items is None:
        return None
    return tuple(
        check_int(v, path(path(where, key), i), minimum=minimum, maximum=maximum)
        for i, v in enumerate(items)
    )


def str_list(
    raw: Mapping[str, Any], key: str, where: str, *, max_len: int = MAX_LIST
) -> tuple[str, ...] | None:
    """A list of strings; ``None`` when absent or null."""
    items = _list(raw, key, where, max_len=max_len, scalar=False)
    if items is None:
        return None
    for i, v in enumerate(items):
        if not isinstance(v, str):
            raise fail(
                f"{key}[{i}]: expected a string, got {_type_name(v)} {show(v)}",
                path(path(where, key), i),
                f"make every entry of {key} a string",
            )
    return tuple(items)
