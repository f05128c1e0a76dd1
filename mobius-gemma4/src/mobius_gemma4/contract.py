"""The pipeline contracts of Gemma 4 packages (docs/architecture.md §3, docs/gemma4.md §8).

- ``gemma4_text``: core's one-component :func:`mobius.lm.lm_contract` for
  :func:`~mobius_gemma4.ports.lm_shape` (the KV loop only over cache-owning layers).
- ``gemma4`` / ``gemma4_unified``: ``embedding`` → ``decoder`` (``inputs_embeds`` and, with
  PLE, ``per_layer_inputs`` every step) with the decoder's KV loop
  (:func:`mobius.lm.kv_states`), plus the presence-gated ``vision_encoder`` (``image``) and
  ``audio_encoder`` (``audio``) whose features feed ``embedding`` by edges, with ``[0, H]``
  zero fallbacks when the modality is absent (:func:`_media_parts`). With the ``"vision"``
  image-block mask the decoder also reads the caller's ``input_ids``.
"""

from __future__ import annotations

from mobius.contract import Component, Contract, Edge, ExternalInput, OptionalInput
from mobius.lm.ports import kv_states, lm_contract, to_ports
from mobius.records import BuildOptions
from mobius_gemma4.config import Gemma4Config
from mobius_gemma4.ports import (
    decoder_ports,
    embedding_ports,
    encoder_ports,
    has_audio,
    has_vision,
    lm_shape,
    vision_overlay,
)

VISION, AUDIO = "vision_encoder", "audio_encoder"


def text_components(config: Gemma4Config, options: BuildOptions) -> tuple[str, ...]:
    """Component names in build order."""
    if config.model_type == "gemma4_text":
        return ("model",)
    media = (VISION,) if has_vision(config) else ()
    media += (AUDIO,) if has_audio(config) else ()
    return (*media, "embedding", "decoder")


def pipeline_contract(config: Gemma4Config, options: BuildOptions) -> Contract:
    dtype = options.port_dtype
    text = config.text
    if config.model_type == "gemma4_text":
        return lm_contract(lm_shape(text), dtype, logits=options.logits)
    e_in, e_out = embedding_ports(text, dtype, image=has_vision(config), audio=has_audio(config))
    overlay = vision_overlay(config)
    d_in, d_out = decoder_ports(text, dtype, input_ids=overlay, logits=options.logits)
    media_components, media_edges, media_externals, media_optionals = _media_parts(config, dtype)
    # The image-block mask reads the same caller ids as the embedding: one ExternalInput
    # per consuming port, both named ``input_ids``.
    ids_for_decoder = (
        (ExternalInput("decoder.input_ids", "input_ids", "caller"),) if overlay else ()
    )
    edges = [Edge("embedding.inputs_embeds", "decoder.inputs_embeds")]
    if text.has_ple:
        edges.append(Edge("embedding.per_layer_inputs", "decoder.per_layer_inputs"))
    return Contract(
        components=(
            *media_components,
            Component("embedding", to_ports(e_in), to_ports(e_out)),
            Component("decoder", to_ports(d_in), to_ports(d_out)),
        ),
        edges=(*media_edges, *edges),
        states=kv_states(lm_shape(text), "decoder"),
        externals=(
            *media_externals,
            ExternalInput("embedding.input_ids", "input_ids", "caller"),
            *ids_for_decoder,
            ExternalInput("decoder.attention_mask", "attention_mask", "generated"),
            ExternalInput("decoder.position_ids", "position_ids", "generated"),
        ),
        optionals=media_optionals,
        outputs=("decoder.logits",),
    )


def _media_parts(config: Gemma4Config, dtype: str):
    """Encoder components, their edges into ``embedding``, caller externals and the
    ``[0, H]`` zero fallbacks of the embedding's feature inputs (docs/gemma4.md §8.3, §8.5)."""
    hidden = config.text.hidden_size
    components, edges, externals, optionals = [], [], [], []
    for present, name, key, feature in (
        (has_vision(config), VISION, "image", "image_features"),
        (has_audio(config), AUDIO, "audio", "audio_features"),
    ):
        if not present:
            continue
        ins, outs = encoder_ports(config, name, dtype)
        components.append(Component(name, to_ports(ins), to_ports(outs), presence=key))
        edges.append(Edge(f"{name}.{feature}", f"embedding.{feature}"))
        externals += [ExternalInput(f"{name}.{port}", port, "caller") for port, _, _ in ins]
        optionals.append(OptionalInput(f"embedding.{feature}", key, (0, hidden)))
    return tuple(components), tuple(edges), tuple(externals), tuple(optionals)
