"""Weight plans of the encoder components of a ``gemma4`` package.

``vision_encoder`` reads ``model.vision_tower.*`` + ``model.embed_vision.*`` and
``audio_encoder`` reads ``model.audio_tower.*`` + ``model.embed_audio.*`` through the
plans of :mod:`mobius_gemma4.vision` / :mod:`mobius_gemma4.audio`.
"""

from __future__ import annotations

from mobius.errors import WeightPlanError
from mobius.records import BuildOptions
from mobius.weights import WeightPlan
from mobius_gemma4.config import Gemma4Config


def media_weight_plan(config: Gemma4Config, component: str, options: BuildOptions) -> WeightPlan:
    if component == "vision_encoder" and config.vision_config is not None:
        from mobius_gemma4.vision import read_vision_config, vision_weight_plan

        vc = read_vision_config(config.vision_config, where="config.json: vision_config")
        return vision_weight_plan(vc, options)
    if component == "audio_encoder" and config.audio_config is not None:
        from mobius_gemma4.audio import audio_weight_plan, read_audio_config

        ac = read_audio_config(config.audio_config, where="config.json: audio_config")
        return audio_weight_plan(ac, options)
    raise WeightPlanError(
        f"no weight plan for {component!r}: config.json has no matching tower config",
        where="mobius_gemma4.weights.media",
        fix="vision_encoder needs vision_config and audio_encoder needs audio_config",
    )
