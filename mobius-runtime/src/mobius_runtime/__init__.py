"""mobius-runtime: run mobius model packages with ONNX Runtime.

``Pipeline.load(path)`` opens a package and executes its contract;
``Pipeline.generate()`` does greedy or sampled generation; ``mobius run`` is the
command-line face (added through the ``mobius_add_commands`` hook).
onnxruntime is imported only when a package is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["GenerationResult", "Pipeline", "__version__"]

if TYPE_CHECKING:
    from mobius_runtime.pipeline import GenerationResult, Pipeline


def __getattr__(name: str) -> Any:
    if name in ("Pipeline", "GenerationResult"):
        from mobius_runtime import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)
