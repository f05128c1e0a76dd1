"""A malformed generation_config.json is warned about (naming the file), never dropped silently."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import mobius
from mobius.config import generation_eos

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
    with caplog.at_level(logging.WARNING, logger="mobius"):
        assert generation_eos(path) is None
    (record,) = caplog.records
    assert record.getMessage().startswith(f"{path} {problem}"), record.getMessage()
    assert "fix or remove that file" in record.getMessage()


def test_the_build_warns_and_keeps_the_config_stop_ids(tmp_path, caplog) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(TINY, ckpt)
    (ckpt / "generation_config.json").write_text('{"eos_token_id": [1, 6]', encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="mobius"):
        result = mobius.build(str(ckpt), str(tmp_path / "pkg"))
    warned = [r.getMessage() for r in caplog.records if "generation_config.json" in r.getMessage()]
    assert len(warned) == 1 and "cannot be read as JSON" in warned[0], warned
    genai = json.loads((result.out / "genai_config.json").read_text())
    config = json.loads((TINY / "config.json").read_text())
    expected = config["eos_token_id"]
    assert genai["model"]["eos_token_id"] == (
        expected if isinstance(expected, list) else [expected]
    )


def test_an_extra_generation_config_eos_id_stops_the_runtime(tmp_path) -> None:
    """generation_config.json's eos ids reach the runtime's stop ids, not only genai_config.

    A copy of the tiny checkpoint whose generation_config.json adds an eos id that
    config.json lacks: the id the package generates greedily third. The package built
    from it must stop there (``stop_reason`` ``stop_id``) and list the same stop ids in
    ``genai_config.json`` and in the runtime's processors.
    """
    pytest.importorskip("onnxruntime")
    from mobius_runtime import Pipeline

    plain = Pipeline.load(mobius.build(str(TINY), str(tmp_path / "plain")).out)
    stops = plain.text.processors.stop_token_ids
    assert stops == tuple(json.loads((TINY / "config.json").read_text())["eos_token_id"])
    base = plain.generate("hello world", max_new_tokens=8)
    assert base.stop_reason == "max_new_tokens" and len(base.ids) == 8
    # the first generated id after the first one that is new (not a stop id, not seen)
    k, extra = next(
        (i, t) for i, t in enumerate(base.ids) if i >= 1 and t not in stops + tuple(base.ids[:i])
    )

    ckpt = tmp_path / "ckpt"
    shutil.copytree(TINY, ckpt)
    gen_path = ckpt / "generation_config.json"
    gen = json.loads(gen_path.read_text(encoding="utf-8"))
    gen["eos_token_id"] = [*stops, extra]
    gen_path.write_text(json.dumps(gen), encoding="utf-8")

    out = mobius.build(str(ckpt), str(tmp_path / "pkg")).out
    genai = json.loads((out / "genai_config.json").read_text())
    pipe = Pipeline.load(out)
    assert pipe.text.processors.stop_token_ids == (*stops, extra)
    assert genai["model"]["eos_token_id"] == [*stops, extra]
    result = pipe.generate("hello world", max_new_tokens=8)
    assert result.ids == base.ids[: k + 1]
    assert result.stop_reason == "stop_id"
