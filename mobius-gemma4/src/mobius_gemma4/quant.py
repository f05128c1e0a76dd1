"""Which Gemma 4 tensors stay float (or get int8) in a ``--quant`` build.

Core quantizes every MatMul on a planned 2-D weight and every embedding Gather
(``docs/quantization.md``); this answers ``mobius_quant_overrides`` for what Gemma 4
should keep:

- MoE router projections (``*.router.*``): a top-k choice flips on small errors;
- the vision patch embedder and the audio feature embedder
  (``*patch_embedder*``, ``*subsample_conv_projection*``): the first layer sees raw
  pixels / mel features, and they are small;
- the multimodal embedders' projections into the text model (``embed_vision.*``,
  ``embed_audio.*``): small, and every soft token passes through them;
- ``--quant-lm-head``: the output projection. Gemma 4 ties it to the token embedding,
  so the table (``embed_tokens.weight``; ``lm_head.weight`` where a split package
  plans it separately) gets the asked type.

Norm weights, scales and convolutions are never candidates (not MatMul / Gather
weights), so they need no entry.
"""

from __future__ import annotations

from typing import Any

KEEP_FLOAT = (
    "*.router.*",
    "*patch_embedder*",
    "*subsample_conv_projection*",
    "embed_vision.*",
    "embed_audio.*",
)
"""Globs over initializer names kept float in every component."""

LM_HEAD = ("embed_tokens.weight", "lm_head.weight")
"""The tied token table / output projection, as initializers of the text components."""


def quant_overrides(component: str, quant: Any) -> dict[str, str]:
    """glob → ``float`` / ``int4`` / ``int8`` for ``component`` (see the module doc)."""
    out = {glob: "float" for glob in KEEP_FLOAT}
    if (
        quant is not None
        and quant.lm_head is not None
        and component
        in (
            "model",
            "embedding",
            "decoder",
        )
    ):
        out.update({name: quant.lm_head for name in LM_HEAD})
    return out
