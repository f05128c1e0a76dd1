"""Gemma 4 audio: config record, ``audio_encoder`` graph, weight plan, numpy feature extractor.

- :func:`read_audio_config` → :class:`Gemma4AudioConfig`
- :func:`build_audio_encoder` (cfg, text hidden size, BuildOptions) → ``onnx_ir.Model``
- :func:`audio_weight_plan` (cfg, BuildOptions) → ``mobius.weights.WeightPlan``
- :class:`Gemma4AudioFeatureExtractor` → :class:`AudioBatch`
"""

from mobius_gemma4.audio.config import Gemma4AudioConfig, read_audio_config
from mobius_gemma4.audio.encoder import AUDIO_COMPONENT, build_audio_encoder
from mobius_gemma4.audio.features import AudioBatch, Gemma4AudioFeatureExtractor, load_audio
from mobius_gemma4.audio.weights import audio_weight_entries, audio_weight_plan

__all__ = [
    "AUDIO_COMPONENT",
    "AudioBatch",
    "Gemma4AudioConfig",
    "Gemma4AudioFeatureExtractor",
    "audio_weight_entries",
    "audio_weight_plan",
    "build_audio_encoder",
    "load_audio",
    "read_audio_config",
]
