"""IO binding for one step, through onnxruntime's C-level binding object when it has one.

onnxruntime's Python ``IOBinding`` wrapper re-validates every OrtValue on every
``bind_ortvalue_input`` (session compatibility, WebGPU capture pins, a device-type
lookup by name) and ``InferenceSession.run_with_iobinding`` checks for WebGPU graph
capture on each call. For a small model those checks are a large share of a decode
step: measured on the tiny Gemma 4 (11 inputs, 9 outputs per step, onnxruntime
1.31 CPU), the wrapper calls cost more than the session's own ``run``. The runtime
binds only OrtValues it made for the same session's device and never captures
graphs, so :class:`StepBinding` calls the C-level object (``IOBinding._iobinding``,
``InferenceSession._sess``) directly, and keeps a reference to every bound OrtValue
until the step's outputs are read (a numpy-backed CPU OrtValue must outlive the
run, which the wrapper guaranteed by keeping it too). Where those attributes are
missing (another onnxruntime), it uses the public wrapper unchanged.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _c_device(device: str) -> Any:
    import onnxruntime as ort

    return ort.OrtDevice.make(device, 0)._get_c_device()


class StepBinding:
    """Bind inputs / outputs of one session run and read its outputs as OrtValues."""

    def __init__(self, session: Any) -> None:
        self._binding = session.io_binding()
        self._c = getattr(self._binding, "_iobinding", None)
        self._sess = getattr(session, "_sess", None)
        self._session = session
        self._fast = self._c is not None and self._sess is not None
        self._keep: list[Any] = []

    def input(self, name: str, value: Any) -> None:
        if self._fast and hasattr(value, "_ortvalue"):
            self._c.bind_ortvalue_input(name, value._ortvalue)
            self._keep.append(value)
        else:
            self._binding.bind_ortvalue_input(name, value)

    def output(self, name: str, value: Any) -> None:
        if self._fast and hasattr(value, "_ortvalue"):
            self._c.bind_ortvalue_output(name, value._ortvalue)
            self._keep.append(value)
        else:
            self._binding.bind_ortvalue_output(name, value)

    def output_on(self, name: str, device: str) -> None:
        if self._fast:
            self._c.bind_output(name, _c_device(device))
        else:
            self._binding.bind_output(name, device)

    def run(self) -> list[Any]:
        """Run the session; its outputs in graph order."""
        if not self._fast:
            self._session.run_with_iobinding(self._binding)
            return self._binding.get_outputs()
        import onnxruntime as ort

        self._sess.run_with_iobinding(self._c, None)
        outputs = self._c.get_outputs()
        self._keep.clear()
        return [ort.OrtValue(outputs[i]) for i in range(len(outputs))]
