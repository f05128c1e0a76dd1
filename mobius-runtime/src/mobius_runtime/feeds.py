"""Turning numpy arrays into OrtValues of exactly the dtype a session declares.

Sessions declare types as ``tensor(float16)`` etc. Every feed is converted to
that type (a BOOL mask is fed as bool, f16 as f16). bfloat16 has no numpy dtype
of its own in onnxruntime's Python API, so bf16 arrays (``ml_dtypes.bfloat16``)
are passed as their uint16 bit patterns with the ONNX element type stated
explicitly; on CUDA the value is allocated on the device and filled in place.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import ml_dtypes
import numpy as np

BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16

ORT_TO_NUMPY: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(bfloat16)": ml_dtypes.bfloat16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}

PORT_TO_ORT: dict[str, str] = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "bfloat16": "tensor(bfloat16)",
    "float64": "tensor(double)",
    "int64": "tensor(int64)",
    "int32": "tensor(int32)",
    "int16": "tensor(int16)",
    "int8": "tensor(int8)",
    "uint8": "tensor(uint8)",
    "bool": "tensor(bool)",
}


def numpy_dtype(ort_type: str) -> Any:
    """The numpy dtype for an ORT type string (``tensor(float16)`` → float16)."""
    try:
        return ORT_TO_NUMPY[ort_type]
    except KeyError:
        raise TypeError(f"unsupported tensor type {ort_type}") from None


def to_ortvalue(array: Any, ort_type: str, device: str = "cpu") -> Any:
    """An OrtValue holding ``array`` converted to ``ort_type`` on ``device``."""
    import onnxruntime as ort

    dtype = numpy_dtype(ort_type)
    data = np.ascontiguousarray(np.asarray(array).astype(dtype, copy=False))
    if dtype is ml_dtypes.bfloat16:
        bits = data.view(np.uint16)
        if device == "cpu":
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, BFLOAT16)
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(data.shape), BFLOAT16, device, 0)
        if data.size:
            value.update_inplace(bits)
        return value
    if device == "cpu":
        return _cpu_value(ort, data)
    return ort.OrtValue.ortvalue_from_numpy(data, device, 0)


def cpu_value(data: np.ndarray) -> Any:
    """A CPU OrtValue over the contiguous array ``data`` of an onnxruntime dtype (no copy,
    no conversion: the caller has checked both; bf16 goes through :func:`to_ortvalue`)."""
    import onnxruntime as ort

    return _cpu_value(ort, data)


@functools.cache
def _c_cpu_maker() -> tuple[Any, Any] | None:
    """(onnxruntime's C-level ``OrtValue.ortvalue_from_numpy``, its CPU device), looked up
    once; None where the C-level module is not where expected."""
    try:
        from onnxruntime.capi import _pybind_state as C

        from mobius_runtime.iobind import _c_device

        return C.OrtValue.ortvalue_from_numpy, _c_device("cpu")
    except (ImportError, AttributeError, TypeError):
        return None


def _cpu_value(ort: Any, data: np.ndarray) -> Any:
    """A CPU OrtValue over ``data`` (no copy; it keeps ``data`` alive).

    Made through onnxruntime's C-level constructor with a cached device: the public
    ``OrtValue.ortvalue_from_numpy`` looks the device up by name on every call, a
    measurable share of a small model's decode step (see ``mobius_runtime.iobind``; the
    lookups themselves are cached too: importing them at each call cost 2.5 of 4.3 µs).
    Falls back to the public call where the C-level module is not where expected.
    """
    maker = _c_cpu_maker()
    if maker is not None:
        try:
            return ort.OrtValue(maker[0](data, maker[1]), data)
        except TypeError:
            pass
    return ort.OrtValue.ortvalue_from_numpy(data, "cpu", 0)


def to_numpy(value: Any) -> np.ndarray:
    """A numpy copy of an OrtValue (bf16 comes back as ``ml_dtypes.bfloat16``).

    onnxruntime cannot hand bf16 to numpy, so its bytes are copied out by
    pointer; a bf16 value on the GPU is first copied to the host by an Identity
    session whose output is bound to CPU memory.
    """
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    if value.device_name().lower() != "cpu":
        value = _to_host(value)
    shape = tuple(value.shape())
    out = np.empty(shape, dtype=np.uint16)
    if out.size:
        ctypes.memmove(out.ctypes.data, value.data_ptr(), out.nbytes)
    return out.view(ml_dtypes.bfloat16)


def last_position(value: Any) -> np.ndarray:
    """``value[:, -1]`` of a ``[batch, sequence, ...]`` OrtValue as numpy, reading that
    position only: what the token loop takes from the logits.

    On the host, onnxruntime's ``OrtValue.numpy()`` is a view of the value's own buffer,
    so the row is a view too (no copy: a greedy pick reads the logits where onnxruntime
    wrote them, and the view keeps the buffer alive); bf16, which numpy cannot view,
    copies the last position of each row only; a value on a device is copied to the host
    first (the runtime binds logits to host memory, so it never is in the token loop).
    """
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()[:, -1]
    if value.device_name().lower() != "cpu":
        return to_numpy(value)[:, -1]
    batch, seq, *rest = (int(d) for d in value.shape())
    out = np.empty((batch, *rest), dtype=np.uint16)
    row = out[0].nbytes if batch else 0
    for b in range(batch if row else 0):
        ctypes.memmove(out[b].ctypes.data, value.data_ptr() + (b * seq + seq - 1) * row, row)
    return out.view(ml_dtypes.bfloat16)


@functools.cache
def _identity_session(ort_type: str, device: str) -> Any:
    import onnxruntime as ort
    from onnx import helper

    from mobius.onnx_versions import IR_VERSION, OPSET
    from mobius_runtime.device import providers_for

    elem = {"tensor(bfloat16)": BFLOAT16}[ort_type]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "to_host",
        [helper.make_tensor_value_info("x", elem, None)],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    return ort.InferenceSession(model.SerializeToString(), providers=providers_for(device))


def _to_host(value: Any) -> Any:
    session = _identity_session(value.data_type(), "cuda")
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", value)
    binding.bind_output("y", "cpu")
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0]


def zeros(shape: tuple[int, ...], ort_type: str, device: str = "cpu") -> Any:
    """A zero-filled OrtValue (used for optional fallbacks and first-step state)."""
    return to_ortvalue(np.zeros(shape, dtype=numpy_dtype(ort_type)), ort_type, device)
