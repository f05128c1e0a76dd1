"""Fuzzing Gemma 4's config readers from raw dicts: only ConfigError (a MobiusError) comes out.

``read_config`` (and the vision / audio readers it hands sub-configs to) turn the
plain JSON of config.json into typed records. Hypothesis starts from real tiny
configs and replaces keys of the top level, ``text_config``, ``rope_parameters``,
``per_layer_config``, ``vision_config`` and ``audio_config`` with arbitrary JSON
values (wrong types, negatives, NaN, 2**62, deep structures), or feeds wholly
arbitrary JSON. Every example must return a config or raise a MobiusError, within
a time and memory guard (a layer count of 2**62 must be refused, not allocated).

Budget, guard and counts come from :mod:`mobius_testing.fuzz`:
``MOBIUS_FUZZ_PROFILE`` = ``ci`` (200 examples per target, default) or
``long`` (20 000, ``tox -e fuzz``); counts are printed at the end of the module and
appended as JSON lines to the file named by ``MOBIUS_FUZZ_COUNTS``.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference.paths import CONFIGS

from mobius.errors import MobiusError
from mobius_gemma4.audio.config import read_audio_config
from mobius_gemma4.config import read_config
from mobius_gemma4.vision.config import read_vision_config
from mobius_testing.fuzz import FUZZ, guard, report_counts

pytestmark = pytest.mark.l1  # config reading is the first stage of a build

COUNTS: Counter[str] = Counter()
_report_counts = report_counts(COUNTS)

# ---------------------------------------------------------------------- base configs

TINY_TEXT: dict[str, Any] = {
    "model_type": "gemma4_text",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "global_head_dim": 32,
    "hidden_size_per_layer_input": 16,
    "vocab_size_per_layer_input": 128,
    "num_kv_shared_layers": 2,
    "sliding_window": 8,
    "layer_types": ["sliding_attention"] * 2
    + ["full_attention"]
    + ["sliding_attention"] * 2
    + ["full_attention"],
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
        },
    },
    "final_logit_softcapping": 30.0,
    "eos_token_id": [1, 106],
}
"""A self-contained tiny text config (the full-size configs of testdata/configs are added to it)."""

FIXTURES = CONFIGS


def _bases() -> list[tuple[str, dict[str, Any]]]:
    bases = [
        ("gemma4_text", TINY_TEXT),
        ("gemma4", {"model_type": "gemma4", "text_config": TINY_TEXT}),
    ]
    for path in sorted(FIXTURES.glob("*.json")):
        raw = json.loads(path.read_text())
        if raw.get("model_type") in ("gemma4", "gemma4_text"):
            bases.append((raw["model_type"], raw))
    assert len(bases) > 2, f"no gemma4 configs under {FIXTURES}"
    return bases


BASES = _bases()

HUGE = st.sampled_from([2**31, 2**62, 2**63, 2**64, -(2**62), -1, 0])
JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-5, 300)
    | HUGE
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(["full_attention", "sliding_attention", "default", "proportional", "vision"])
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
SECTIONS = [
    "",
    "text_config",
    "rope_parameters",
    "per_layer_config",
    "vision_config",
    "audio_config",
]


@st.composite
def mutated_configs(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A real config with one to three keys of one section replaced by arbitrary JSON."""
    model_type, base = draw(st.sampled_from(BASES))
    raw = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        section = draw(st.sampled_from(SECTIONS))
        text = raw.get("text_config") if model_type == "gemma4" else raw
        if section == "":
            target = raw
        elif section == "text_config":
            target = text if isinstance(text, dict) else raw
        elif section == "rope_parameters":
            rope = text.get("rope_parameters") if isinstance(text, dict) else None
            target = (
                draw(st.sampled_from(list(rope.values())))
                if isinstance(rope, dict) and rope
                else raw
            )
        elif section == "per_layer_config":
            if not isinstance(text, dict):
                continue
            plc = text.setdefault("per_layer_config", {})
            target = (
                plc.setdefault(str(draw(st.integers(-1, 8))), {}) if isinstance(plc, dict) else raw
            )
        else:
            sub = raw.get(section)
            target = sub if isinstance(sub, dict) else raw
        if not isinstance(target, dict):
            continue
        keys = sorted(target) or ["x"]
        key = draw(st.sampled_from(keys) | st.text(max_size=6))
        target[key] = draw(JSON_VALUES)
    return model_type, raw


def check(model_type: Any, raw: Any, target: str) -> None:
    COUNTS[target] += 1
    with guard(), contextlib.suppress(MobiusError):
        read_config(model_type, raw)


@FUZZ
@given(mutated_configs())
def test_mutated_real_configs(case: tuple[str, dict[str, Any]]) -> None:
    check(*case, "gemma4:read_config mutated")


@FUZZ
@given(
    st.sampled_from(["gemma4", "gemma4_text", "gemma3", ""]),
    JSON_VALUES | st.dictionaries(st.sampled_from(sorted(TINY_TEXT)), JSON_VALUES, max_size=6),
)
def test_arbitrary_json(model_type: str, raw: Any) -> None:
    check(model_type, raw, "gemma4:read_config arbitrary")


@FUZZ
@given(
    st.sampled_from(["num_hidden_layers", "num_kv_shared_layers", "head_dim", "vocab_size"]), HUGE
)
def test_huge_sizes_are_refused_or_kept_lazy(key: str, value: int) -> None:
    """A config may claim any size; reading it must not allocate or loop by that size."""
    raw = {**TINY_TEXT, "num_kv_shared_layers": 0, key: value}
    if key == "num_hidden_layers":
        raw.pop("layer_types")
    check("gemma4_text", raw, "gemma4:read_config huge")


@FUZZ
@given(
    st.sampled_from(["vision_config", "audio_config"]),
    st.sampled_from(
        [b for b in BASES if isinstance(b[1].get("vision_config"), dict)] or [("", {})]
    ),
    st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3),
)
def test_encoder_configs(section: str, base: tuple[str, dict[str, Any]], patch: dict) -> None:
    COUNTS[f"gemma4:{section}"] += 1
    sub = dict(base[1].get(section) or {})
    keys = sorted(sub)
    if keys and patch:
        sub[keys[len(patch) % len(keys)]] = next(iter(patch.values()))
    sub.update(patch)
    reader = read_vision_config if section == "vision_config" else read_audio_config
    with guard(), contextlib.suppress(MobiusError):
        reader(sub)
