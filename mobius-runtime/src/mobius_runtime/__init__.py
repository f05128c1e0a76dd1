"""mobius-runtime: run mobius model packages with ONNX Runtime.

``Pipeline.load(path)`` opens a package and executes its contract;
``Pipeline.generate()`` does greedy or sampled generation; ``mobius run`` is the
command-line face (added through the ``mobius_add_commands`` hook).
onnxruntime is imported only when a package is loaded, with its telemetry off.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# onnxruntime (1.31, Linux included) starts a telemetry client when it is imported,
# which writes a device id and an event database under
# ~/.cache/Microsoft/DeveloperTools/.onnxruntime/. Running a model must write
# nothing outside the paths the user named, so it is switched off before any
# module of this package imports onnxruntime; a value the user set is kept.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__version__ = "0.1.1.dev0"
__all__ = [
    "ChatSession",
    "FinishReason",
    "GenerationResult",
    "Pipeline",
    "SamplingParams",
    "__version__",
]

if TYPE_CHECKING:
    from mobius_runtime.chat_session import ChatSession
    from mobius_runtime.decoding import FinishReason
    from mobius_runtime.generation import GenerationResult
    from mobius_runtime.pipeline import Pipeline
    from mobius_runtime.sampling import SamplingParams

_LAZY = {
    "ChatSession": "chat_session",
    "Pipeline": "pipeline",
    "GenerationResult": "generation",
    "SamplingParams": "sampling",
    "FinishReason": "decoding",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"mobius_runtime.{_LAZY[name]}"), name)
    raise AttributeError(name)
