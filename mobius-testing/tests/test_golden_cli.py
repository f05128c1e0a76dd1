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
