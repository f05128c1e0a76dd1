"""Fuzzing the config.json readers: only ConfigError (a MobiusError) ever comes out.

Two readers see a checkpoint's config.json: :func:`mobius.config.read_config_file`
(the build picks the plugin by ``model_type``) and the checkpoint opener
(:func:`mobius.checkpoint.open_local`). Hypothesis feeds both random bytes,
non-UTF-8 text, arbitrary JSON values, deeply nested arrays and objects and
integer literals beyond Python's 4300-digit limit; each example must end in a
returned ``(model_type, dict)`` or a MobiusError, within the time and memory guard.

Budget, guard and counts: :mod:`mobius_testing.fuzz` (``MOBIUS_FUZZ_PROFILE``,
``MOBIUS_FUZZ_COUNTS``).
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mobius.checkpoint import open_local
from mobius.config import read_config_file
from mobius.errors import MobiusError
from mobius_testing.fuzz import FUZZ, guard, report_counts

COUNTS: Counter[str] = Counter()
_report_counts = report_counts(COUNTS)

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**62, -(2**63), 2**64])
    | st.floats()
    | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
CONFIG_OBJECTS = st.dictionaries(
    st.sampled_from(["model_type", "text_config", "hidden_size", "architectures"])
    | st.text(max_size=8),
    JSON_VALUES,
    max_size=6,
)


def _nested(depth: int, opener: str) -> str:
    closer = {"[": "]", '{"model_type":': "}", '{"model_type":"x","a":': "}"}[opener]
    return opener * depth + "1" + closer * depth


CONFIG_BYTES = st.one_of(
    st.binary(max_size=256),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    CONFIG_OBJECTS.map(lambda v: json.dumps(v).encode()),
    CONFIG_OBJECTS.map(lambda v: json.dumps(v).encode()[:-1]),  # truncated
    st.tuples(
        st.integers(1, 100_000), st.sampled_from(["[", '{"model_type":', '{"model_type":"x","a":'])
    ).map(lambda t: _nested(*t).encode()),
    st.integers(4301, 20_000).map(lambda n: ('{"model_type":"x","n":' + "7" * n + "}").encode()),
    st.binary(min_size=1, max_size=8).map(lambda b: b'{"model_type":"' + b + b'"}'),
)


def _write(tmp: str, content: bytes) -> Path:
    root = Path(tmp) / "ckpt"
    root.mkdir()
    (root / "config.json").write_bytes(content)
    return root


@FUZZ
@given(CONFIG_BYTES)
def test_read_config_file(content: bytes) -> None:
    COUNTS["config:read_config_file"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        root = _write(tmp, content)
        with guard():
            try:
                model_type, raw = read_config_file(root)
            except MobiusError:
                return
        assert isinstance(model_type, str) and model_type and raw["model_type"] == model_type


@FUZZ
@given(CONFIG_BYTES)
def test_open_local_config(content: bytes) -> None:
    COUNTS["config:open_local"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        root = _write(tmp, content)
        with guard():
            try:
                ckpt = open_local(root)
            except MobiusError:
                return
        assert isinstance(ckpt.raw_config, dict)


@pytest.mark.parametrize(
    "content",
    [
        b"[" * 100_000,
        ("[" * 50_000 + "]" * 50_000).encode(),
        ('{"model_type":"x","n":' + "1" * 5000 + "}").encode(),
        b'{"model_type": "a", "model_type": "b"}',
    ],
    ids=["unclosed-nesting", "deep-nesting", "5000-digit-int", "duplicate-model-type"],
)
@pytest.mark.parametrize("reader", ["read_config_file", "open_local"])
def test_known_hostile_configs(tmp_path: Path, content: bytes, reader: str) -> None:
    root = _write(str(tmp_path), content)
    call = read_config_file if reader == "read_config_file" else open_local
    try:
        call(root)
    except MobiusError as exc:
        assert "config.json" in (exc.where or "") + exc.what
