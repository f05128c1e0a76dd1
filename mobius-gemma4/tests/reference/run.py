"""Running a built package for the parity tests: only through ``mobius_runtime.Pipeline``.

The tests never wire sub-models: :func:`load_pipeline` opens the package with the
runtime, and :func:`step_logits` drives ``Pipeline.step`` (the runtime's own
executor, the same path as ``generate``): the prompt step with any media, then one
cached single-token step per remaining id.

bf16 packages: onnxruntime's CPU provider has no bfloat16 kernels, so on CPU a
package whose manifest says ``dtype: bf16`` is loaded with the runtime's
``graph_transform`` hook set to :func:`mobius_testing.bf16_emulation.emulate_bf16`
(float32 graphs that round to bf16 after every op that stores bf16, fusions off).
Inputs, state and outputs are then float32 holding bf16 values; figures from such a
run are labelled "bf16 (emulated on CPU)".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def is_bf16(package: Path) -> bool:
    """True when the package was built with ``--dtype bf16``."""
    import json

    return json.loads((Path(package) / "mobius.json").read_text()).get("dtype") == "bf16"


def load_pipeline(package: Path) -> Any:
    """A CPU, single-thread :class:`mobius_runtime.Pipeline`; bf16 packages emulated."""
    from mobius_runtime import Pipeline

    if not is_bf16(package):
        return Pipeline.load(package, device="cpu", threads=1)
    from mobius_testing.bf16_emulation import emulate_bf16

    return Pipeline.load(
        package, device="cpu", threads=1, graph_transform=emulate_bf16, optimize=False
    )


def step_logits(
    pipeline: Any, ids: np.ndarray, prompt_len: int, media: dict[str, Any] | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Prefill ``ids[:, :prompt_len]`` (with ``media``), then cached single-token steps.

    Returns the logits ``[B, T, V]`` as float32 (comparable to a no-cache forward over
    ``ids``) and every output of the prompt step (encoder features among them).
    """
    outs, state = pipeline.step(input_ids=ids[:, :prompt_len], **(media or {}))
    chunks = [outs["logits"].astype(np.float32)]
    for s in range(prompt_len, ids.shape[1]):
        step, state = pipeline.step(state, input_ids=ids[:, s : s + 1])
        chunks.append(step["logits"].astype(np.float32))
    return np.concatenate(chunks, axis=1), outs
