"""Gemma 4 vision: config record, ``vision_encoder`` graph, weight plan, numpy image processor.

Building blocks the plugin wires into the package contract:

- :func:`read_vision_config` → :class:`Gemma4VisionConfig`
- :func:`build_vision_encoder` (cfg, text hidden size, BuildOptions) → ``onnx_ir.Model``
- :func:`vision_weight_plan` (cfg, BuildOptions) → ``mobius.weights.WeightPlan``
- :class:`Gemma4ImageProcessor` → :class:`ImageBatch`
"""

from mobius_gemma4.vision.config import Gemma4VisionConfig, read_vision_config
from mobius_gemma4.vision.encoder import VISION_COMPONENT, build_vision_encoder
from mobius_gemma4.vision.processor import Gemma4ImageProcessor, ImageBatch
from mobius_gemma4.vision.weights import vision_weight_entries, vision_weight_plan

__all__ = [
    "VISION_COMPONENT",
    "Gemma4ImageProcessor",
    "Gemma4VisionConfig",
    "ImageBatch",
    "build_vision_encoder",
    "read_vision_config",
    "vision_weight_entries",
    "vision_weight_plan",
]
