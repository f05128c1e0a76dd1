"""pytest plugin of mobius-testing (entry point ``pytest11: mobius``).

Registers the harness markers so any family's tests can tag their level:
``l1`` build, ``l2`` architecture, ``l3`` synthetic parity, ``l4`` golden logits,
``l5`` golden generation, ``gpu`` needs a CUDA device, ``reference`` needs the
``[reference]`` extra (torch + transformers).
"""

from __future__ import annotations

import pytest

MARKERS = {
    "l1": "L1 build: tiny config builds, onnx.checker + shape inference, contract validates",
    "l2": "L2 architecture: full-size configs build without weights; geometry and counts",
    "l3": "L3 synthetic parity: tiny random checkpoints, ORT vs HF",
    "l4": "L4 golden logits: real checkpoint, one prefill vs stored golden",
    "l5": "L5 golden generation: real checkpoint, greedy ids vs stored golden",
    "gpu": "needs a CUDA device",
    "reference": "needs the [reference] extra (torch, transformers)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
