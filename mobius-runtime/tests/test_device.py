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


LOG = (
    "\x1b[1;31m2026-12-01 22:50:32 [E:onnxruntime:Default, provider_bridge_ort.cc:2458 operator()] "
    "FAIL : Failed to load library .../libonnxruntime_providers_cuda.so with error: "
    "libcublasLt.so.13: cannot open shared object file: No such file or directory\n\x1b[m\n"
    "\x1b[0;93m2026-12-01 [W:onnxruntime:Default, onnxruntime_pybind_state.cc:1295] Failed to "
    "create CUDAExecutionProvider. Require cuDNN 9.* and CUDA 13.*. Please install all "
    "dependencies as mentioned in the GPU requirements page\n"
)


@pytest.mark.parametrize("gpu", [True, False, None])
def test_a_cuda_failure_says_what_is_missing(gpu) -> None:
    """Was "install onnxruntime-gpu" for users who had it and lacked CUDA libraries or a GPU."""
    from mobius_runtime.device import describe_cuda_failure

    what, fix = describe_cuda_failure(LOG, "1.31.1", gpu)
    assert what.startswith("onnxruntime-gpu 1.31.1 cannot start CUDA here: the library ")
    assert "libcublasLt.so.13 is not found" in what
    assert "install cuDNN 9.* and CUDA 13.* (e.g. pip install 'onnxruntime-gpu[cuda,cudnn]'" in fix
    assert ("no NVIDIA GPU is visible" in what) == (gpu is False)
    assert ("a machine with an NVIDIA GPU" in fix) == (gpu is False)
    assert "install onnxruntime-gpu" not in fix
    # nothing recognisable in the log: its first line, without the logger's colours
    what, fix = describe_cuda_failure("\x1b[1;31msomething else broke\x1b[m\n", "1.31.1", True)
    assert what.endswith("onnxruntime says: something else broke")
    assert fix.startswith("install the CUDA and cuDNN versions it was built for")


def test_cuda_request_names_the_real_problem_on_this_machine():
    """Runs the real probe: the installed build decides which message is right."""
    import onnxruntime as ort

    if cuda_usable():
        pytest.skip("CUDA works on this machine")
    with pytest.raises(DeviceError) as info:
        resolve_device("cuda")
    if "CUDAExecutionProvider" in ort.get_available_providers():  # onnxruntime-gpu
        assert "onnxruntime-gpu" in info.value.what and "cannot start CUDA here" in info.value.what
        assert "install onnxruntime-gpu" not in info.value.fix
    else:
        assert "CPU-only build" in info.value.what
        assert "pip install onnxruntime-gpu" in info.value.fix


def test_unknown_device():
    with pytest.raises(DeviceError, match="auto, cpu, cuda"):
        resolve_device("tpu")


def test_provider_lists():
    assert providers_for("cpu") == ["CPUExecutionProvider"]
    assert providers_for("cuda")[-1] == "CPUExecutionProvider"
