"""Weight plans of the encoder components of a ``gemma4`` package.

``vision_encoder`` reads ``model.vision_tower.*`` + ``model.embed_vision.*`` and
``audio_encoder`` reads ``model.audio_tower.*`` + ``model.embed_audio.*`` through the
plans of :mod:`mobius_gemma4.vision` / :mod:`mobius_gemma4.audio`.
"""

from __future__ import annotations

from typing import Any

from mobius.errors import WeightPlanError
from mobius.records import BuildOptions
from mobius.weights import WeightPlan
from mobius_gemma4.config import Gemma4Config


def media_weight_plan(
    config: Gemma4Config, component: str, options: BuildOptions, checkpoint: Any = None
) -> WeightPlan:
    if component == "vision_encoder" and config.vision is not None:
        from mobius_gemma4.vision import vision_weight_plan

        return vision_weight_plan(config.vision, options, checkpoint)
    if component == "audio_encoder" and config.audio is not None:
        from mobius_gemma4.audio import audio_weight_plan

        return audio_weight_plan(config.audio, options)
    raise WeightPlanError(
        f"no weight plan for {component!r}: config.json has no matching tower config",
        where="mobius_gemma4.weights.media",
        fix="vision_encoder needs vision_config and audio_encoder needs audio_config",
    )
