"""The pipeline contracts of Gemma 4 text packages (ARCHITECTURE §3, reference §8).

- ``gemma4_text``: one ``model`` component; KV state loops ``present.{i}.* →
  past_key_values.{i}.*`` for cache-owning layers only, first fed ``[batch, kvh_i, 0, hd_i]``.
- ``gemma4``: ``embedding`` → ``decoder`` (``inputs_embeds`` and, with PLE,
  ``per_layer_inputs`` every step). The vision/audio issue adds encoder components,
  their edges into ``embedding`` and optional-input fallbacks in :func:`_media_parts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mobius.records import BuildOptions
from mobius_gemma4.config import Gemma4Config
from mobius_gemma4.ports import PortSpec, decoder_ports, embedding_ports, model_ports

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


def _media_parts(config: Gemma4Config):
    """Encoder components, edges and optional inputs (none until the vision/audio issue)."""
    return (), (), ()


def text_components(config: Gemma4Config, options: BuildOptions) -> tuple[str, ...]:
    """Component names in build order."""
    return ("model",) if config.model_type == "gemma4_text" else ("embedding", "decoder")


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
    e_in, e_out = embedding_ports(text, dtype)
    d_in, d_out = decoder_ports(text, dtype)
    media_components, media_edges, media_optionals = _media_parts(config)
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
            ExternalInput("embedding.input_ids", "input_ids", "caller"),
            ExternalInput("decoder.attention_mask", "attention_mask", "generated"),
            ExternalInput("decoder.position_ids", "position_ids", "generated"),
        ),
        optionals=media_optionals,
        outputs=("decoder.logits",),
    )
