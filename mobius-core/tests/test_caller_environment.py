"""Core's tests pass whatever Hub settings the caller's shell has.

Why: ``test_a_mistyped_local_path_says_no_such_folder`` failed for a user who had
``HF_HUB_OFFLINE=1`` exported. The Hub-facing test files run again here in a child
pytest with the variables that change huggingface_hub's behaviour set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
HUB_FACING = ("test_checkpoint.py", "test_hostile_checkpoints.py")
"""The test files that open Hub ids (each is a few seconds)."""


@pytest.mark.parametrize("value", ["1", "0"])
def test_hub_tests_pass_with_hf_hub_offline_set(value: str, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": value, "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"]
        + [str(TESTS / name) for name in HUB_FACING],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
