"""Choosing an execution provider that can really run.

``onnxruntime-gpu`` lists ``CUDAExecutionProvider`` as available even on a machine
without a GPU or without the CUDA libraries; creating a session then logs an
error and silently falls back to CPU. So CUDA is chosen only after a probe
session, created with ORT's logger silenced, actually reports CUDA among its
providers. The answer is cached for the process.
"""

from __future__ import annotations

import functools

from mobius_runtime.errors import DeviceError

DEVICES = ("auto", "cpu", "cuda")

_FATAL_ONLY = 4
_WARNING = 2


def _probe_model() -> bytes:
    """A one-node graph (Identity), serialized."""
    from onnx import TensorProto, helper

    from mobius.onnx_versions import IR_VERSION, OPSET

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "cuda_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    return model.SerializeToString()


@functools.cache
def cuda_usable() -> bool:
    """True when a CUDA session can be created here (probe, errors silenced)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    ort.set_default_logger_severity(_FATAL_ONLY)
    try:
        options = ort.SessionOptions()
        options.log_severity_level = _FATAL_ONLY
        session = ort.InferenceSession(
            _probe_model(),
            sess_options=options,
            providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
        )
        return "CUDAExecutionProvider" in session.get_providers()
    except Exception:
        return False
    finally:
        ort.set_default_logger_severity(_WARNING)


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when usable else ``cpu``; ``cuda`` must be usable."""
    if device not in DEVICES:
        raise DeviceError(
            f"unknown device {device!r}",
            where="device",
            fix=f"use one of {', '.join(DEVICES)}",
        )
    if device == "cpu":
        return "cpu"
    usable = cuda_usable()
    if device == "cuda" and not usable:
        what, fix = cuda_problem()
        raise DeviceError(
            f"device 'cuda' was requested but {what}",
            where="onnxruntime CUDAExecutionProvider",
            fix=f"{fix}, or use --device cpu / auto",
        )
    return "cuda" if usable else "cpu"


_PROBE = (
    "import onnxruntime as ort\n"
    "from mobius_runtime.device import _probe_model\n"
    "ort.InferenceSession(_probe_model(), "
    "providers=['CUDAExecutionProvider', 'CPUExecutionProvider'])\n"
)


def cuda_problem() -> tuple[str, str]:
    """(what, fix) for a machine where :func:`cuda_usable` is False.

    Why: the error said "install onnxruntime-gpu" to users who had it and lacked the
    CUDA libraries or a GPU. onnxruntime's own explanation goes to its C++ logger, so
    the probe is rerun in a child process (only on this failure path) and its log read.
    """
    import subprocess
    import sys

    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (
            f"the installed onnxruntime {ort.__version__} is a CPU-only build",
            "install onnxruntime-gpu in its place (pip uninstall onnxruntime, then "
            "pip install onnxruntime-gpu)",
        )
    try:
        log = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
        ).stderr
    except (OSError, subprocess.SubprocessError) as exc:
        log = str(exc)
    return describe_cuda_failure(log, ort.__version__, gpu_visible())


def gpu_visible() -> bool | None:
    """Whether an NVIDIA GPU is visible to this process (None: cannot tell, not Linux)."""
    import sys
    from pathlib import Path

    if not sys.platform.startswith("linux"):
        return None
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/version").exists()


def describe_cuda_failure(log: str, version: str, gpu: bool | None) -> tuple[str, str]:
    """(what, fix) from onnxruntime-gpu's log of a failed CUDA session."""
    import re

    missing = re.search(r"error: (lib[\w.+-]+\.so[\w.]*): cannot open shared object", log)
    needs = re.search(r"Require (cuDNN [\w.*]+ and CUDA [\w.*]+)", log)
    parts = []
    if missing:
        parts.append(f"the library {missing.group(1)} is not found")
    if gpu is False:
        parts.append("no NVIDIA GPU is visible (no /dev/nvidia0)")
    if not parts:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", log)  # the logger's colours
        first = next((line.strip() for line in plain.splitlines() if line.strip()), "no log")
        parts.append(f"onnxruntime says: {first}")
    what = f"onnxruntime-gpu {version} cannot start CUDA here: " + "; ".join(parts)
    requirement = (
        needs.group(1).rstrip(".") if needs else "the CUDA and cuDNN versions it was built for"
    )
    fixes = []
    if missing or gpu is not False:
        fixes.append(
            f"install {requirement} (e.g. pip install 'onnxruntime-gpu[cuda,cudnn]' for "
            "NVIDIA's wheels) or put them on LD_LIBRARY_PATH"
        )
    if gpu is False:
        fixes.append("run on a machine with an NVIDIA GPU and its driver")
    return what, "; ".join(fixes)


def providers_for(device: str) -> list[str]:
    """The provider list for a resolved device (CPU always last as a fallback)."""
    if device == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]
