"""Device selection: CUDA only when it really runs, silently CPU otherwise."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mobius_runtime.device import cuda_usable, providers_for, resolve_device
from mobius_runtime.errors import DeviceError


def test_auto_falls_back_to_cpu_without_printing_anything(single_pkg):
    code = (
        "from mobius_runtime import Pipeline\n"
        f"p = Pipeline.load({str(single_pkg)!r}, device='auto')\n"
        "print(p.device, sorted({x for v in p.providers.values() for x in v}))\n"
        "p.generate(input_ids=[3, 4], max_new_tokens=2)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    device = done.stdout.split()[0]
    assert device == ("cuda" if cuda_usable() else "cpu")


def test_cuda_request_without_cuda_is_a_clear_error():
    if cuda_usable():
        pytest.skip("CUDA works on this machine")
    with pytest.raises(DeviceError, match="cuda"):
        resolve_device("cuda")


def test_unknown_device():
    with pytest.raises(DeviceError, match="auto, cpu, cuda"):
        resolve_device("tpu")


def test_provider_lists():
    assert providers_for("cpu") == ["CPUExecutionProvider"]
    assert providers_for("cuda")[-1] == "CPUExecutionProvider"
