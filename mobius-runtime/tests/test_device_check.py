"""scripts/device_check.sh: argument handling and the CPU-only path (no GPU in CI).

The GPU path itself runs only where a CUDA GPU is lent; here a fake ``nvidia-smi``
stands in for the driver: one that finds no GPU (the script says so and exits 0),
and one that claims a GPU while onnxruntime cannot open CUDA (the check fails and
says why, in the report file).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_check.sh"


def _run(tmp_path: Path, *args: str, smi_exit: int | None = 9) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if smi_exit is not None:
        smi.write_text(f"#!/bin/sh\necho 'GPU 0: Fake'\nexit {smi_exit}\n")
        smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(SCRIPT), "--python", sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    out = _run(tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no CUDA GPU on this machine" in out.stdout
    assert not list(tmp_path.glob("device-check-*.txt"))  # no report for nothing checked


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--bogus"], "unknown argument '--bogus'"),
        (["--budget", "ten"], "--budget must be whole seconds, got 'ten'"),
        (["--out"], "--out needs a file name"),
    ],
)
def test_bad_arguments_exit_2(tmp_path, args, needle):
    out = _run(tmp_path, *args)
    assert out.returncode == 2
    assert needle in out.stderr


def test_an_existing_report_or_busy_work_folder_is_never_touched(tmp_path):
    report = tmp_path / "mine.txt"
    report.write_text("keep me")
    out = _run(tmp_path, "--out", str(report))
    assert out.returncode == 2 and "exists" in out.stderr
    assert report.read_text() == "keep me"
    work = tmp_path / "work"
    work.mkdir()
    (work / "file").write_text("x")
    out = _run(tmp_path, "--work", str(work))
    assert out.returncode == 2 and "not empty" in out.stderr
    assert (work / "file").read_text() == "x"


def test_help(tmp_path):
    out = _run(tmp_path, "--help")
    assert out.returncode == 0 and "--no-mid" in out.stdout and "memory-bandwidth" in out.stdout


def test_a_gpu_onnxruntime_cannot_use_fails_with_a_report(tmp_path):
    from mobius_runtime.device import cuda_usable

    if cuda_usable():
        pytest.skip("CUDA works here: the real check is scripts/device_check.sh itself")
    report = tmp_path / "report.txt"
    out = _run(tmp_path, "--out", str(report), "--no-golden", "--no-mid", smi_exit=0)
    assert out.returncode == 1, out.stdout + out.stderr
    text = report.read_text()
    assert "cannot open a CUDA session here" in text
    assert "device check finished" in text and "FAILED" in text
