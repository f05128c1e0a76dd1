"""context_length(): a broken genai_config.json is warned about (naming the file), not ignored."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mobius_runtime.text import context_length


def _package(tmp_path: Path, genai: str | None) -> Path:
    if genai is not None:
        (tmp_path / "genai_config.json").write_text(genai, encoding="utf-8")
    return tmp_path


def test_a_valid_file_gives_its_context_length(tmp_path, caplog) -> None:
    root = _package(tmp_path, json.dumps({"model": {"context_length": 77}}))
    with caplog.at_level(logging.WARNING):
        assert context_length(root, {}) == 77
    assert caplog.records == []


def test_no_file_no_cap_no_warning(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert context_length(_package(tmp_path, None), {}) is None
    assert caplog.records == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "has no readable model.context_length (JSONDecodeError"),
        ('{"model": {}}', "has no readable model.context_length (KeyError"),
        ("[1, 2]", "has no readable model.context_length (TypeError"),
        ('{"model": {"context_length": "4096"}}', "model.context_length is '4096'"),
        ('{"model": {"context_length": -1}}', "model.context_length is -1"),
        ('{"model": {"context_length": true}}', "model.context_length is True"),
    ],
)
def test_a_broken_file_is_named_in_a_warning(tmp_path, caplog, text: str, problem: str) -> None:
    root = _package(tmp_path, text)
    with caplog.at_level(logging.WARNING, logger="mobius_runtime"):
        assert context_length(root, {}) is None
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith(f"{root / 'genai_config.json'} {problem}"), message
    assert "fix the file or rebuild the package" in message


def test_the_manifest_wins_over_the_file(tmp_path, caplog) -> None:
    root = _package(tmp_path, "{not json")
    with caplog.at_level(logging.WARNING):
        assert context_length(root, {"context_length": 32}) == 32
    assert caplog.records == []
