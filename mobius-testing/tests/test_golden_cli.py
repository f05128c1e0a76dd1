"""`mobius golden check` / `regen` (typer sub-app) and the tiny case end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mobius_testing.golden_cli import app

REPO = Path(__file__).resolve().parents[2]
TINY_CASE = REPO / "mobius-gemma4" / "tests" / "cases" / "tiny-gemma4-text.case.toml"
runner = CliRunner()


def test_check_without_cases_says_how_to_give_them(monkeypatch):
    monkeypatch.delenv("MOBIUS_CASES", raising=False)
    monkeypatch.setattr("mobius_testing.golden_cli.registered_case_dirs", lambda: [])
    result = runner.invoke(app, ["check"])
    assert result.exit_code == 2
    assert "no case folders" in result.output


def test_regen_refuses_bad_case_with_file_and_field(tmp_path):
    pytest.importorskip("transformers")
    bad = tmp_path / "x.case.toml"
    bad.write_text('family = "f"\n')
    result = runner.invoke(app, ["regen", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}: field" in result.output


def test_check_runs_the_tiny_case_through_the_runtime_on_cpu():
    """The committed tiny-gemma4 goldens, checked at L4 and L5 through mobius_runtime.Pipeline."""
    pytest.importorskip("mobius_gemma4", reason="building tiny-gemma4 needs the gemma4 family")
    result = runner.invoke(app, ["check", str(TINY_CASE), "--device", "cpu", "--", "-q"])
    assert result.exit_code == 0, result.output


@pytest.mark.reference
def test_regen_reproduces_the_committed_tiny_goldens(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = runner.invoke(
        app, ["regen", str(TINY_CASE), "--golden-dir", str(tmp_path), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    committed = TINY_CASE.parent / "goldens"
    for level in ("l4", "l5"):
        new = json.loads((tmp_path / f"tiny-gemma4-text.{level}.json").read_text())
        old = json.loads((committed / f"tiny-gemma4-text.{level}.json").read_text())
        prov_new, prov_old = new.pop("provenance"), old.pop("provenance")
        assert new == old, level  # ids, hex logits, summary, margins: bit for bit
        assert prov_new["files"] == prov_old["files"]  # same checkpoint bytes
        assert {"transformers", "torch", "device", "date", "reference_dtype"} <= set(prov_new)


@pytest.mark.parametrize("kind", ["user-file", "symlink", "folder"])
def test_regen_never_overwrites_what_is_not_a_golden(tmp_path, kind):
    """Refused before the reference runs; the user's file, link and its target are untouched."""
    pytest.importorskip("transformers")
    target = tmp_path / "tiny-gemma4-text.l4.json"
    mine = tmp_path / "mine.txt"
    mine.write_text("not a golden")
    if kind == "user-file":
        target.write_text("my notes about the l4 golden")
    elif kind == "symlink":
        target.symlink_to(mine)
    else:
        target.mkdir()
    before = {p.name: (p.is_symlink(), p.is_file() and p.read_bytes()) for p in tmp_path.iterdir()}
    result = runner.invoke(app, ["regen", str(TINY_CASE), "--golden-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    needle = {
        "user-file": "is not a golden file",
        "symlink": "symbolic link",
        "folder": "not a file",
    }
    assert needle[kind] in result.output and str(target) in result.output
    after = {p.name: (p.is_symlink(), p.is_file() and p.read_bytes()) for p in tmp_path.iterdir()}
    assert after == before


def test_a_golden_is_rewritten_in_place_and_others_refused(tmp_path):
    from mobius.errors import PackageError
    from mobius_testing.golden import Inputs, L5Golden, write_l5

    golden = L5Golden(
        case="c", inputs=Inputs((1, 2)), ids=(3,), text="x", pieces=("x",), margins=(1.0,),
        stop_ids=(0,), stop_reason="length", max_new_tokens=1, provenance={},
    )  # fmt: skip
    path = write_l5(tmp_path, golden)
    assert write_l5(tmp_path, golden) == path  # a previous golden is replaced
    path.unlink()
    path.write_text('{"kind": "notes"}')
    with pytest.raises(PackageError, match="is not a golden file"):
        write_l5(tmp_path, golden)
    assert path.read_text() == '{"kind": "notes"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.l5.json"]
