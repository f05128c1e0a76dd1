"""config.json reading: plain JSON, and a clear error for each way it can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mobius.cli import make_app
from mobius.config import model_type_of, read_config_file
from mobius.errors import ConfigError
from mobius.plugins import PluginHost


def test_reads_model_type_and_raw(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gemma4", "x": [1, 2]}')
    assert read_config_file(tmp_path) == ("gemma4", {"model_type": "gemma4", "x": [1, 2]})


def test_real_fixture_configs_parse(tmp_path: Path) -> None:
    """Every full-size config bundled in testdata/configs reads as its model type."""
    folder = Path(__file__).resolve().parents[2] / "testdata" / "configs"
    configs = sorted(folder.glob("*.json"))
    assert len(configs) >= 10, f"expected the bundled configs under {folder}"
    for path in configs:
        (tmp_path / "config.json").write_bytes(path.read_bytes())
        model_type, raw = read_config_file(tmp_path)
        assert model_type == raw["model_type"], path.name
        assert model_type in (
            "gemma4",
            "gemma4_text",
            "gemma4_unified",
            "qwen3",
            "qwen3_moe",
            "llama",
            "mistral",
            "gemma3_text",
        )


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found") as info:
        read_config_file(tmp_path / "nope")
    assert info.value.where == str(tmp_path / "nope") and info.value.fix


def test_file_instead_of_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="is a file"):
        read_config_file(tmp_path / "config.json")


def test_missing_config_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no config\.json") as info:
        read_config_file(tmp_path)
    assert info.value.where == str(tmp_path / "config.json")


def test_invalid_json_names_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{\n  "model_type": "gemma4",\n  "x": ,\n}')
    with pytest.raises(ConfigError) as info:
        read_config_file(tmp_path)
    assert "line 3 column 8" in info.value.what
    assert info.value.where == f"{tmp_path / 'config.json'}:3:8"


@pytest.mark.parametrize("text", ['{"hidden_size": 4}', '{"model_type": 3}', '{"model_type": ""}'])
def test_no_usable_model_type(tmp_path: Path, text: str) -> None:
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match="model_type"):
        read_config_file(tmp_path)


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        read_config_file(tmp_path)


def test_model_type_of() -> None:
    assert model_type_of({"model_type": "t"}, where="w") == "t"


# --------------------------------------------------------------------------- via `mobius build`


def run_build(host: PluginHost, source: Path, out: Path):
    result = CliRunner().invoke(make_app(), ["build", str(source), str(out)], obj={"host": host})
    return result


def assert_short_failure(result, out: Path, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.splitlines()) <= 4
    for needle in needles:
        assert needle in result.stderr
    assert not out.exists()
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(out.name)]
    assert leftovers == []


def test_cli_folder_without_config_json(tiny_host, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    out = tmp_path / "out"
    assert_short_failure(run_build(tiny_host, tmp_path / "ckpt", out), out, "no config.json")


def test_cli_missing_folder(tiny_host, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert_short_failure(run_build(tiny_host, tmp_path / "absent", out), out, "not found")


def test_cli_invalid_json(tiny_host, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text('{"model_type": "tinytest",,}')
    out = tmp_path / "out"
    assert_short_failure(
        run_build(tiny_host, tmp_path / "ckpt", out), out, "not valid JSON", "line 1 column 27"
    )


def test_cli_unknown_model_type_lists_installed_plugins(tiny_host, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    out = tmp_path / "out"
    assert_short_failure(
        run_build(tiny_host, tmp_path / "ckpt", out),
        out,
        "'llama'",
        "tinytest (mobius-tinytest): tinytest",
        "fix:",
    )
