"""The fixture scripts the testdata READMEs tell developers to run never overwrite a
user's folder: ``scripts/make_tiny_checkpoint.py`` (text, ``--multimodal``, ``--media``)
and ``scripts/make_tiny_qwen3.py`` write by file name, so they refuse an OUT that is not
new, empty, or a folder they wrote before (its README.md starts with their title).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


@pytest.mark.parametrize(
    "script, mode",
    [
        ("make_tiny_checkpoint.py", []),
        ("make_tiny_checkpoint.py", ["--multimodal"]),
        ("make_tiny_checkpoint.py", ["--media"]),
        ("make_tiny_qwen3.py", []),
    ],
)
def test_a_user_folder_is_refused_untouched(tmp_path: Path, script: str, mode: list[str]) -> None:
    user = tmp_path / "my-model"
    user.mkdir()
    files = {"config.json": b'{"mine": true}', "README.md": b"# my model\n", "tiny.png": b"x"}
    for name, data in files.items():
        (user / name).write_bytes(data)
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *mode, str(user)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "is not empty and not a folder this script wrote" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert {p.name: p.read_bytes() for p in user.iterdir()} == files


def test_the_bundled_folders_are_their_own_previous_output(tmp_path: Path) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        from make_tiny_checkpoint import TITLES, foreign_out
    finally:
        sys.path.remove(str(SCRIPTS))
    testdata = REPO / "testdata"
    assert foreign_out(testdata / "tiny-gemma4", TITLES["text"]) is None
    assert foreign_out(testdata / "tiny-gemma4-mm", TITLES["multimodal"]) is None
    assert foreign_out(testdata / "media", TITLES["media"]) is None
    assert foreign_out(testdata / "tiny-qwen3", "# tiny-qwen3: ") is None
    assert foreign_out(tmp_path / "new", TITLES["text"]) is None
    assert foreign_out(tmp_path, TITLES["text"]) is None  # empty
    (tmp_path / "f").write_text("x")
    assert "is not a folder" in foreign_out(tmp_path / "f", TITLES["text"])
    assert "is not empty" in foreign_out(testdata / "tiny-gemma4", TITLES["multimodal"])
