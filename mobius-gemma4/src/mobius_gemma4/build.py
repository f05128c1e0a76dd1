"""Dispatch from a contract component name to its graph builder, per target.

``--target default`` builds the portable ONNX ``Attention`` + ``RotaryEmbedding`` graph.
``cpu`` / ``cuda`` currently build the same exact graph: a com.microsoft
GroupQueryAttention lowering must keep the sliding window, the per-type proportional
cos/sin tables and KV-sharing semantics (reference §9, trap T6), and until that lowering
is verified against HF we never emit a silently different graph. A log line says so.
"""

from __future__ import annotations

import logging

from mobius.errors import BuildError
from mobius.records import BuildOptions
from mobius_gemma4.config import Gemma4Config

log = logging.getLogger("mobius_gemma4")


def build_component(config: Gemma4Config, component: str, options: BuildOptions):
    if options.target in ("cpu", "cuda"):
        log.info(
            "target %s: Gemma 4 keeps the exact ONNX Attention path on every layer "
            "(GroupQueryAttention lowering not enabled yet)",
            options.target,
        )
    if config.model_type == "gemma4_text" and component == "model":
        from mobius_gemma4.text.causal_lm import build_causal_lm

        return build_causal_lm(config.text, options.dtype)
    if config.model_type == "gemma4" and component == "embedding":
        from mobius_gemma4.text.embedding import build_embedding

        return build_embedding(config, options.dtype)
    if config.model_type == "gemma4" and component == "decoder":
        from mobius_gemma4.text.decoder import build_decoder

        return build_decoder(config.text, options.dtype)
    raise BuildError(
        f"{config.model_type} has no component {component!r}",
        where="mobius_gemma4.build.build_component",
        fix="gemma4_text builds 'model'; gemma4 builds 'embedding' and 'decoder'",
    )
