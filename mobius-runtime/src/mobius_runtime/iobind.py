"""IO binding of a component's session, through onnxruntime's C-level binding object when
it has one, kept from one step of a request to the next.

onnxruntime's Python ``IOBinding`` wrapper re-validates every OrtValue on every
``bind_ortvalue_input`` (session compatibility, WebGPU capture pins, a device-type
lookup by name) and ``InferenceSession.run_with_iobinding`` checks for WebGPU graph
capture on each call. For a small model those checks are a large share of a decode
step: measured on the tiny Gemma 4 (11 inputs, 9 outputs per step, onnxruntime
1.31 CPU), the wrapper calls cost more than the session's own ``run``. The runtime
binds only OrtValues it made for the same session's device and never captures
graphs, so :class:`StepBinding` calls the C-level object (``IOBinding._iobinding``,
``InferenceSession._sess``) directly. Where those attributes are missing (another
onnxruntime), it uses the public wrapper unchanged.

A binding lives as long as its request (:class:`mobius_runtime.executor.Steps`): a
value bound at one step stays bound until a later step binds another under that name,
so what does not change between decode steps (shared KV buffers bound as both past and
present, an input array written in place) is bound once. It keeps a reference to every
bound OrtValue while it is bound (a numpy-backed CPU OrtValue must outlive the runs
that read it, which the wrapper guaranteed by keeping it too). Outputs bound to a
device (not to an OrtValue) are bound again before every run: after a run onnxruntime
holds the value it allocated there and would write the next run into it (an error
when the shape changes, and the previous step's logits overwritten when it does not).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping
from typing import Any


@functools.cache
def _c_device(device: str) -> Any:
    import onnxruntime as ort

    return ort.OrtDevice.make(device, 0)._get_c_device()


@functools.cache
def _ortvalue_class() -> Any:
    import onnxruntime as ort

    return ort.OrtValue


class StepBinding:
    """Bind inputs / outputs of a session's runs and read their outputs as OrtValues."""

    def __init__(self, session: Any) -> None:
        self._binding = session.io_binding()
        self._c = getattr(self._binding, "_iobinding", None)
        self._sess = getattr(session, "_sess", None)
        self._session = session
        self._fast = self._c is not None and self._sess is not None
        self._inputs: dict[str, Any] = {}  # name -> the OrtValue bound under it now
        self._outputs: dict[str, Any] = {}
        self._kept: dict[Any, tuple[int, list[int]]] = {}  # skip -> (outputs, indices kept)
        self._count = len(session.get_outputs())

    @property
    def bound_inputs(self) -> dict[str, Any]:
        """Input name -> the OrtValue bound under it now (read-only use: a caller may skip
        :meth:`input` for a value that is bound there already)."""
        return self._inputs

    @property
    def bound_outputs(self) -> dict[str, Any]:
        """Output name -> the OrtValue it is written into now (as :attr:`bound_inputs`)."""
        return self._outputs

    def input(self, name: str, value: Any) -> None:
        """Bind ``value`` as input ``name`` (nothing to do when it is bound there already)."""
        if self._inputs.get(name) is value:
            return
        if self._fast and hasattr(value, "_ortvalue"):
            self._c.bind_ortvalue_input(name, value._ortvalue)
        else:
            self._binding.bind_ortvalue_input(name, value)
        self._inputs[name] = value

    def inputs_from(self, values: Mapping[str, Any], names: Iterable[tuple[str, str]]) -> None:
        """Bind ``values[key]`` as input ``name`` for each (name, key) of ``names`` (those
        bound there already are skipped): :meth:`input` in one loop, for a step's state
        inputs (8 to 60 of them, each a new OrtValue at every step of a concat-KV build)."""
        bound = self._inputs
        if not self._fast:
            for name, key in names:
                self.input(name, values[key])
            return
        bind = self._c.bind_ortvalue_input
        for name, key in names:
            value = values[key]
            if bound.get(name) is not value:
                if hasattr(value, "_ortvalue"):
                    bind(name, value._ortvalue)
                else:
                    self._binding.bind_ortvalue_input(name, value)
                bound[name] = value

    def input_host(self, name: str, array: Any, pointer: int) -> None:
        """Bind the C-contiguous host array ``array`` (at address ``pointer``, which the
        caller keeps: ``array.ctypes.data`` costs a ctypes object a call) as input
        ``name`` by its address and shape: no OrtValue is made for it (a decode step's
        mask, a new view of the request's ones at every step: 1.0 µs where making and
        binding an OrtValue cost 2.1, measured on onnxruntime 1.31). The binding keeps
        ``array`` until another value is bound under ``name``.
        """
        if self._fast:
            self._c.bind_input(name, _c_device("cpu"), array.dtype, array.shape, pointer)
        else:
            self._binding.bind_cpu_input(name, array)
        self._inputs[name] = array

    def output(self, name: str, value: Any) -> None:
        """Write output ``name`` into ``value`` (nothing to do when it is bound there already)."""
        if self._outputs.get(name) is value:
            return
        if self._fast and hasattr(value, "_ortvalue"):
            self._c.bind_ortvalue_output(name, value._ortvalue)
        else:
            self._binding.bind_ortvalue_output(name, value)
        self._outputs[name] = value

    def output_on(self, name: str, device: str) -> None:
        """Let the run allocate output ``name`` on ``device`` (bind before every run)."""
        self._outputs.pop(name, None)
        if self._fast:
            self._c.bind_output(name, _c_device(device))
        else:
            self._binding.bind_output(name, device)

    def outputs_on(self, outputs: Iterable[tuple[str, str]]) -> None:
        """:meth:`output_on` for each (name, device) of ``outputs``, in one loop."""
        if not self._fast:
            for name, device in outputs:
                self.output_on(name, device)
            return
        bound, bind = self._outputs, self._c.bind_output
        for name, device in outputs:
            bound.pop(name, None)
            bind(name, _c_device(device))

    def run(self, skip: Collection[int] = ()) -> list[Any]:
        """Run the session; its outputs in graph order (None at the indices in ``skip``:
        outputs bound to an OrtValue the caller holds already). onnxruntime returns them
        in the order of their first binding, so a caller binds a new binding's outputs in
        graph order (``Steps`` does); binding a name again keeps its place."""
        if not self._fast:
            self._session.run_with_iobinding(self._binding)
            return self._binding.get_outputs()
        self._sess.run_with_iobinding(self._c, None)
        if len(skip) == self._count:  # the caller holds every output (2 us a call saved)
            return [None] * self._count
        outputs = self._c.get_outputs()
        wrap = _ortvalue_class()
        if not skip:  # indexed: iterating the C-level output vector costs ~5 us a value
            return [wrap(outputs[i]) for i in range(len(outputs))]
        # only the outputs the caller has no OrtValue for are wrapped (Gemma 3 270M with
        # shared KV: 1 of 37, the loop over all of them was ~20 us a token)
        kept = self._kept.get(skip)
        if kept is None or kept[0] != len(outputs):
            kept = self._kept[skip] = (
                len(outputs),
                [i for i in range(len(outputs)) if i not in skip],
            )
        got: list[Any] = [None] * kept[0]
        for i in kept[1]:
            got[i] = wrap(outputs[i])
        return got
