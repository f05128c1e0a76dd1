"""A malformed generation_config.json is warned about (naming the file), never dropped silently."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import mobius
from mobius_gemma4.genai_config import generation_eos

pytestmark = pytest.mark.l1

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"


def test_a_valid_file_gives_its_eos_ids(tmp_path, caplog) -> None:
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"eos_token_id": [1, 106]}), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert generation_eos(path) == [1, 106]
        assert generation_eos(None) is None
    assert caplog.records == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"eos_token_id": [1, 106]', "cannot be read as JSON (Expecting"),
        ("[1, 106]", "holds a JSON list, not an object"),
        ("\udcff", "cannot be read as JSON ("),
    ],
)
def test_a_malformed_file_is_named_in_a_warning(tmp_path, caplog, text: str, problem: str) -> None:
    path = tmp_path / "generation_config.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with caplog.at_level(logging.WARNING, logger="mobius_gemma4"):
        assert generation_eos(path) is None
    (record,) = caplog.records
    assert record.getMessage().startswith(f"{path} {problem}"), record.getMessage()
    assert "fix or remove that file" in record.getMessage()


def test_the_build_warns_and_keeps_the_config_stop_ids(tmp_path, caplog) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(TINY, ckpt)
    (ckpt / "generation_config.json").write_text('{"eos_token_id": [1, 6]', encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="mobius_gemma4"):
        result = mobius.build(str(ckpt), str(tmp_path / "pkg"))
    warned = [r.getMessage() for r in caplog.records if "generation_config.json" in r.getMessage()]
    assert len(warned) == 1 and "cannot be read as JSON" in warned[0], warned
    genai = json.loads((result.out / "genai_config.json").read_text())
    config = json.loads((TINY / "config.json").read_text())
    expected = config["eos_token_id"]
    assert genai["model"]["eos_token_id"] == (
        expected if isinstance(expected, list) else [expected]
    )
