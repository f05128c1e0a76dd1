"""``mobius build -v`` shows the build's per-layer attention op split (README "Targets")."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mobius.cli import make_app

pytestmark = pytest.mark.l1

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"


def _build(tmp_path: Path, *flags: str):
    args = ["build", str(TINY), str(tmp_path / "pkg"), "--target", "cpu", *flags]
    return CliRunner().invoke(make_app(), args, env={"COLUMNS": "200"})


def test_verbose_shows_the_attention_split(tmp_path: Path) -> None:
    result = _build(tmp_path, "-v")
    assert result.exit_code == 0, result.output
    assert "gemma4 target cpu: GroupQueryAttention on all 6 layers" in (result.output)


def test_without_verbose_the_split_is_not_shown(tmp_path: Path) -> None:
    result = _build(tmp_path)
    assert result.exit_code == 0, result.output
    assert "GroupQueryAttention" not in result.output
    assert "built gemma4_text package" in result.output
