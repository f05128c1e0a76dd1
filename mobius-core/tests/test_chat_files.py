"""The build copies the checkpoint's chat template into every package (mobius.chat_files)."""

from __future__ import annotations

import json
from pathlib import Path

from mobius.chat_files import chat_files
from mobius.records import RuntimeFile


class _Checkpoint:
    def __init__(self, root: Path) -> None:
        self.root = root

    def file(self, name: str) -> Path | None:
        path = self.root / name
        return path if path.is_file() else None


def _by_path(files):
    return {rf.path: rf for rf in files}


def test_jinja_file_wins_over_tokenizer_config(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("J")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "T"}))
    files = _by_path(chat_files(_Checkpoint(tmp_path), []))
    assert files["chat_template.jinja"].source == tmp_path / "chat_template.jinja"
    assert files["tokenizer_config.json"].source == tmp_path / "tokenizer_config.json"


def test_template_from_tokenizer_config_string_and_named_list(tmp_path):
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": "{{ bos_token }}T"}))
    files = _by_path(chat_files(_Checkpoint(tmp_path), []))
    assert files["chat_template.jinja"].content == b"{{ bos_token }}T"
    named = [{"name": "tool_use", "template": "X"}, {"name": "default", "template": "D"}]
    cfg.write_text(json.dumps({"chat_template": named}))
    assert _by_path(chat_files(_Checkpoint(tmp_path), []))["chat_template.jinja"].content == b"D"


def test_no_template_and_plugin_files_are_kept(tmp_path, caplog):
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "X"}]}))
    assert set(_by_path(chat_files(_Checkpoint(tmp_path), []))) == {"tokenizer_config.json"}
    assert "no template named 'default'" in caplog.text
    cfg.write_text("{not json")
    assert set(_by_path(chat_files(_Checkpoint(tmp_path), []))) == {"tokenizer_config.json"}
    assert "not readable JSON" in caplog.text
    (tmp_path / "chat_template.jinja").write_text("J")
    plugin = [RuntimeFile("chat_template.jinja", content=b"P"), RuntimeFile("x", content=b"")]
    assert set(_by_path(chat_files(_Checkpoint(tmp_path), plugin))) == {"tokenizer_config.json"}
    assert chat_files(_Checkpoint(tmp_path / "missing"), []) == []


def test_tokenizer_files_are_copied_for_every_family(tmp_path):
    """Core copies each tokenizer file the checkpoint has; a plugin's own file of that
    name wins (it is not copied twice); absent ones are skipped."""
    for name in ("tokenizer.json", "generation_config.json", "vocab.json", "merges.txt"):
        (tmp_path / name).write_text("{}")
    plugin = [RuntimeFile("merges.txt", content=b"plugin's own")]
    files = chat_files(_Checkpoint(tmp_path), plugin)
    paths = [rf.path for rf in files]
    assert paths == ["tokenizer.json", "generation_config.json", "vocab.json"]
    assert all(rf.source == tmp_path / rf.path for rf in files)
