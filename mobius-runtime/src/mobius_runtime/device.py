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
        raise DeviceError(
            "device 'cuda' was requested but onnxruntime cannot run CUDA here",
            where="onnxruntime CUDAExecutionProvider",
            fix="install onnxruntime-gpu with matching CUDA/cuDNN libraries, "
            "or use --device cpu / auto",
        )
    return "cuda" if usable else "cpu"


def providers_for(device: str) -> list[str]:
    """The provider list for a resolved device (CPU always last as a fallback)."""
    if device == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]
