"""`mobius golden check` / `regen` (typer sub-app) and the tiny case end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mobius_testing.golden import unhex
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


@pytest.mark.reference
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
    """Inputs, ids and text exactly; the float32 logits through the L4/L5 gates.

    Not bit for bit: the CPU's vector kernels (AVX2 / AVX-512) move the reference's
    logits in their last bits with the same library versions (mobius_testing.regen).
    """
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = runner.invoke(
        app, ["regen", str(TINY_CASE), "--golden-dir", str(tmp_path), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    committed = TINY_CASE.parent / "goldens"
    new, old = {}, {}
    for level in ("l4", "l5"):
        new[level] = json.loads((tmp_path / f"tiny-gemma4-text.{level}.json").read_text())
        old[level] = json.loads((committed / f"tiny-gemma4-text.{level}.json").read_text())
        assert new[level]["inputs"] == old[level]["inputs"], level
        prov_new, prov_old = new[level]["provenance"], old[level]["provenance"]
        assert prov_new["files"] == prov_old["files"], level  # same checkpoint bytes
        assert {"transformers", "torch", "cpu_capability", "date"} <= set(prov_new)
    min_margin = 0.01  # the case's [tolerances]
    clear = [unhex(m) >= min_margin for m in old["l4"]["positions"]["margin"]]
    assert new["l4"]["top1"] == old["l4"]["top1"]
    assert [t for t, c in zip(new["l4"]["positions"]["top1"], clear) if c] == [
        t for t, c in zip(old["l4"]["positions"]["top1"], clear) if c
    ]
    for key in ("ids", "text", "pieces", "stop_ids", "stop_reason"):
        assert new["l5"][key] == old["l5"][key], key

    result = runner.invoke(app, ["reproduce", str(TINY_CASE), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "outcome: pass" in result.output and "max |delta|" in result.output


@pytest.mark.reference
def test_reproduce_fails_on_a_golden_the_reference_does_not_give(tmp_path):
    """A top-k logit moved past atol and a changed greedy id: both named, exit 1."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    committed = TINY_CASE.parent / "goldens"
    l4 = json.loads((committed / "tiny-gemma4-text.l4.json").read_text())
    l4["top_k"]["logits"][2] = (unhex(l4["top_k"]["logits"][2]) + 0.01).hex()
    (tmp_path / "tiny-gemma4-text.l4.json").write_text(json.dumps(l4))
    l5 = json.loads((committed / "tiny-gemma4-text.l5.json").read_text())
    l5["ids"][3] = (l5["ids"][3] + 1) % l4["vocab_size"]
    (tmp_path / "tiny-gemma4-text.l5.json").write_text(json.dumps(l5))
    result = runner.invoke(
        app, ["reproduce", str(TINY_CASE), "--golden-dir", str(tmp_path), "--device", "cpu"]
    )
    assert result.exit_code == 1, result.output
    assert "outcome: fail" in result.output
    assert f"id {l4['top_k']['ids'][2]}: golden" in result.output  # the moved logit
    assert "first divergence at generated position 3" in result.output

    l4["inputs"]["input_ids"][5] += 1  # a changed tokenizer or chat template
    (tmp_path / "tiny-gemma4-text.l4.json").write_text(json.dumps(l4))
    result = runner.invoke(
        app, ["reproduce", str(TINY_CASE), "--golden-dir", str(tmp_path), "--device", "cpu"]
    )
    assert result.exit_code == 1, result.output
    assert "prompt ids differ from the golden's at position 5" in result.output


@pytest.mark.reference
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


@pytest.mark.parametrize("command", ["regen", "reproduce"])
def test_root_debug_shows_the_traceback_of_golden_commands(monkeypatch, tmp_path, command):
    """The root help says --debug works for every command; `golden` ignored it."""
    from mobius.cli import make_app
    from mobius_testing.cases import CaseError

    monkeypatch.setattr("mobius_testing.reference.missing_reference", lambda: None)
    root = make_app()
    root.add_typer(app, name="golden")
    missing = str(tmp_path / "no-such.case.toml")
    plain = CliRunner().invoke(root, ["golden", command, missing], obj={})
    assert plain.exit_code == 2 and "no such case file or folder" in plain.output
    assert not isinstance(plain.exception, CaseError)
    debug = CliRunner().invoke(root, ["--debug", "golden", command, missing], obj={})
    assert isinstance(debug.exception, CaseError), debug.output
