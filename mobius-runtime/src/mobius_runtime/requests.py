"""Checks on a generation request made before anything runs.

Values that would otherwise reach onnxruntime and fail inside a graph (an id past
the embedding table is a ``Gather`` index error; an image placeholder without an
image leaves the vision merge without features), or numpy (a negative seed, a NaN
temperature), are refused here with what / where / fix. ``mobius run`` calls
:func:`check_sampling` before it loads the model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mobius_runtime.errors import RequestError


def check_sampling(
    do_sample: bool,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    *,
    flags: bool = False,
) -> None:
    """Sampling settings: every problem in one :class:`RequestError`.

    ``flags`` names the options as the CLI spells them (``--top-p``) and makes a
    sampling option given without sampling an error (greedy would ignore it).
    """
    names = (
        {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}
        if flags
        else {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "seed": "seed"}
    )
    problems: list[str] = []
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float))
    ):
        problems.append(f"{names['temperature']} must be a number, got {temperature!r}")
    elif temperature is not None and (
        not math.isfinite(temperature) or (do_sample and temperature <= 0)
    ):
        problems.append(f"{names['temperature']} must be a finite number > 0, got {temperature}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        problems.append(f"{names['top_p']} must be in (0, 1], got {top_p}")
    if top_k is not None and not (isinstance(top_k, int) and top_k >= 0):
        problems.append(f"{names['top_k']} must be 0 (off) or a positive integer, got {top_k}")
    if seed is not None and not (
        isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0
    ):
        problems.append(f"{names['seed']} must be an integer >= 0, got {seed!r}")
    if problems:
        raise RequestError(
            "; ".join(problems),
            where="sampling options",
            fix="e.g. --sample --temperature 0.7 --top-p 0.9 --seed 1"
            if flags
            else "e.g. do_sample=True, temperature=0.7, top_p=0.9, seed=1",
        )
    if flags and not do_sample:
        given = [
            names[k]
            for k, v in (
                ("temperature", temperature),
                ("top_k", top_k),
                ("top_p", top_p),
                ("seed", seed),
            )
            if v is not None
        ]
        if given:
            raise RequestError(
                f"{', '.join(given)} given without --sample: greedy decoding would ignore "
                f"{'it' if len(given) == 1 else 'them'}",
                where="sampling options",
                fix="add --sample to sample, or drop " + ", ".join(given),
            )


def vocab_size(manifest: Mapping[str, Any]) -> int | None:
    """The model's vocabulary size from the package's config (text_config first)."""
    config = manifest.get("config")
    if not isinstance(config, Mapping):
        return None
    text = config.get("text_config")
    for source in (text if isinstance(text, Mapping) else {}, config):
        value = source.get("vocab_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_ids(
    ids: np.ndarray,
    vocab: int | None,
    placeholders: Mapping[str, tuple[int | None, int]],
    unsupported: Mapping[str, int | None],
) -> None:
    """Prompt ids the model can take: in range, one placeholder per media soft token.

    ``placeholders`` maps a media kind to (its placeholder id, the soft tokens its
    items expand to in this request); ``unsupported`` names placeholder ids of media
    this package cannot take (e.g. video).
    """
    row = ids.reshape(-1)
    low, high = int(row.min()), int(row.max())
    if low < 0 or (vocab is not None and high >= vocab):
        bad = int(row[(row < 0) | (row >= (vocab or np.iinfo(np.int64).max))][0])
        position = int(np.flatnonzero(row == bad)[0])
        raise RequestError(
            f"token id {bad} at position {position} is outside the vocabulary"
            + (f" [0, {vocab})" if vocab is not None else " (ids are >= 0)"),
            where="input_ids",
            fix="pass ids the package's tokenizer produces",
        )
    for kind, (token, expected) in placeholders.items():
        if token is None:
            continue
        found = int(np.count_nonzero(row == token))
        if found != expected:
            media = f"{expected} {kind} soft token(s) from the {kind}(s) given"
            raise RequestError(
                f"the prompt holds {found} {kind} placeholder id(s) ({token}) but "
                + (media if expected else f"no {kind} was given"),
                where="input_ids" if expected or found else "prompt",
                fix=f"pass one {kind} per placeholder (ids: already expanded to its soft "
                f"tokens), or remove the placeholders",
            )
    for kind, token in unsupported.items():
        if token is not None and bool(np.any(row == token)):
            raise RequestError(
                f"the prompt holds the {kind} placeholder id {token}, but this package "
                f"takes no {kind}",
                where="input_ids",
                fix=f"remove the {kind} placeholder",
            )


def check_logits(logits: np.ndarray, step: int) -> None:
    """NaN or +inf logits end generation with an error naming the step."""
    top = float(np.max(logits))
    if not math.isfinite(top):
        what = "NaN" if math.isnan(top) else "infinite"
        raise RequestError(
            f"the model produced {what} logits at generation step {step} "
            f"({'prefill' if step == 0 else 'decode'})",
            where=f"logits, step {step}",
            fix="the package's weights or its dtype overflow: check the build's NaN warnings, "
            "or use a wider dtype (f32 / bf16)",
        )
