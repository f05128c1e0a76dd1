"""Gemma 4 unified (12B, encoder-free): config readers, encoder graphs, weight plans, processors.

- :func:`read_unified_config` → :class:`~mobius_gemma4.config.Gemma4Config` (model_type
  ``gemma4_unified``; text as docs/gemma4.md §3 without PLE, raw vision/audio embedder configs kept)
- :func:`build_unified_vision_encoder` / :func:`build_unified_audio_encoder` → ``onnx_ir.Model``
- :func:`unified_weight_plan` → ``mobius.weights.WeightPlan``
- :class:`UnifiedImageProcessor` / :class:`UnifiedAudioFrames` (numpy preprocessing, docs/gemma4.md §7)
"""

from mobius_gemma4.unified.config import (
    MODEL_TYPE,
    UnifiedAudioConfig,
    UnifiedVisionConfig,
    read_unified_audio_config,
    read_unified_config,
    read_unified_vision_config,
)
from mobius_gemma4.unified.encoders import (
    build_unified_audio_encoder,
    build_unified_vision_encoder,
)
from mobius_gemma4.unified.weights import unified_weight_plan

__all__ = [
    "MODEL_TYPE",
    "UnifiedAudioConfig",
    "UnifiedVisionConfig",
    "build_unified_audio_encoder",
    "build_unified_vision_encoder",
    "read_unified_audio_config",
    "read_unified_config",
    "read_unified_vision_config",
    "unified_weight_plan",
]
