"""The pipeline contracts of Gemma 4 text packages (docs/architecture.md §3, docs/gemma4.md §8).

- ``gemma4_text``: one ``model`` component; KV state loops ``present.{i}.* →
  past_key_values.{i}.*`` for cache-owning layers only, first fed ``[batch, kvh_i, 0, hd_i]``.
- ``gemma4``: ``embedding`` → ``decoder`` (``inputs_embeds`` and, with PLE,
  ``per_layer_inputs`` every step), plus the presence-gated ``vision_encoder`` (``image``)
  and ``audio_encoder`` (``audio``) whose features feed ``embedding`` by edges, with
  ``[0, H]`` zero fallbacks when the modality is absent (:func:`_media_parts`). With the
  ``"vision"`` image-block mask the decoder also reads the caller's ``input_ids``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mobius.records import BuildOptions
from mobius_gemma4.config import Gemma4Config
from mobius_gemma4.ports import (
    PortSpec,
    audio_ports,
    decoder_ports,
    embedding_ports,
    has_audio,
    has_vision,
    model_ports,
    vision_overlay,
    vision_ports,
)

VISION, AUDIO = "vision_encoder", "audio_encoder"

if TYPE_CHECKING:
    from mobius.contract import Contract


def _ports(specs: list[PortSpec]):
    from mobius.contract import Port

    return tuple(Port(name, dtype, tuple(shape)) for name, dtype, shape in specs)


def _states(config: Gemma4Config, component: str):
    from mobius.contract import StateEdge

    text = config.text
    out = []
    for i in range(text.num_cache_layers):
        for kind in ("key", "value"):
            out.append(
                StateEdge(
                    f"{component}.present.{i}.{kind}",
                    f"{component}.past_key_values.{i}.{kind}",
                    ("batch", text.kv_heads[i], 0, text.head_dims[i]),
                )
            )
    return tuple(out)


def _media_parts(config: Gemma4Config, dtype: str):
    """Encoder components, their edges into ``embedding``, caller externals and the
    ``[0, H]`` zero fallbacks of the embedding's feature inputs (docs/gemma4.md §8.3, §8.5)."""
    from mobius.contract import Component, Edge, ExternalInput, OptionalInput

    hidden = config.text.hidden_size
    components, edges, externals, optionals = [], [], [], []
    for present, name, key, ports, feature in (
        (has_vision(config), VISION, "image", vision_ports, "image_features"),
        (has_audio(config), AUDIO, "audio", audio_ports, "audio_features"),
    ):
        if not present:
            continue
        ins, outs = ports(config, dtype)
        components.append(Component(name, _ports(ins), _ports(outs), presence=key))
        edges.append(Edge(f"{name}.{feature}", f"embedding.{feature}"))
        externals += [ExternalInput(f"{name}.{port}", port, "caller") for port, _, _ in ins]
        optionals.append(OptionalInput(f"embedding.{feature}", key, (0, hidden)))
    return tuple(components), tuple(edges), tuple(externals), tuple(optionals)


def text_components(config: Gemma4Config, options: BuildOptions) -> tuple[str, ...]:
    """Component names in build order."""
    if config.model_type == "gemma4_text":
        return ("model",)
    media = (VISION,) if has_vision(config) else ()
    media += (AUDIO,) if has_audio(config) else ()
    return (*media, "embedding", "decoder")


def pipeline_contract(config: Gemma4Config, options: BuildOptions) -> Contract:
    from mobius.contract import Component, Contract, Edge, ExternalInput

    dtype = options.port_dtype
    text = config.text
    if config.model_type == "gemma4_text":
        ins, outs = model_ports(text, dtype)
        return Contract(
            components=(Component("model", _ports(ins), _ports(outs)),),
            states=_states(config, "model"),
            externals=(
                ExternalInput("model.input_ids", "input_ids", "caller"),
                ExternalInput("model.attention_mask", "attention_mask", "generated"),
                ExternalInput("model.position_ids", "position_ids", "generated"),
            ),
            outputs=("model.logits",),
        )
    e_in, e_out = embedding_ports(text, dtype, image=has_vision(config), audio=has_audio(config))
    overlay = vision_overlay(config)
    d_in, d_out = decoder_ports(text, dtype, input_ids=overlay)
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
            Component("embedding", _ports(e_in), _ports(e_out)),
            Component("decoder", _ports(d_in), _ports(d_out)),
        ),
        edges=(*media_edges, *edges),
        states=_states(config, "decoder"),
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
