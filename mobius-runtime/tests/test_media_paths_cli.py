"""`mobius run --image/--audio` refuses a pipe, a device or a folder before loading, at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MOBIUS = Path(sys.executable).parent / "mobius"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.parametrize("kind", ["image", "audio"])
def test_a_fifo_media_path_is_refused_without_hanging(single_pkg, tmp_path, kind) -> None:
    fifo = tmp_path / f"in.{kind}"
    os.mkfifo(fifo)
    cmd = [str(MOBIUS), "run", str(single_pkg), "--prompt", "b", f"--{kind}", str(fifo)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert f"{kind} path {fifo} is a named pipe (FIFO), not a regular file" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_folder_as_image_is_refused(single_pkg, tmp_path) -> None:
    cmd = [str(MOBIUS), "run", str(single_pkg), "--prompt", "b", "--image", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert f"image path {tmp_path} is a folder, not a regular file" in run.stderr
