"""The pipeline contract of a Qwen3 package: one ``model`` component with a KV loop.

``present.{i}.* → past_key_values.{i}.*`` for every layer, first fed
``[batch, num_key_value_heads, 0, head_dim]``; the caller gives ``input_ids``, the
runtime generates ``attention_mask`` and ``position_ids``.
"""

from __future__ import annotations

from mobius.contract import Component, Contract, ExternalInput, Port, StateEdge
from mobius.records import BuildOptions
from mobius_qwen3.config import Qwen3Config
from mobius_qwen3.ports import model_ports


def pipeline_contract(config: Qwen3Config, options: BuildOptions) -> Contract:
    ins, outs = model_ports(config, options.port_dtype)
    states = tuple(
        StateEdge(
            f"model.present.{i}.{kind}",
            f"model.past_key_values.{i}.{kind}",
            ("batch", config.num_key_value_heads, 0, config.head_dim),
        )
        for i in range(config.num_hidden_layers)
        for kind in ("key", "value")
    )
    return Contract(
        components=(
            Component(
                "model",
                tuple(Port(n, d, tuple(s)) for n, d, s in ins),
                tuple(Port(n, d, tuple(s)) for n, d, s in outs),
            ),
        ),
        states=states,
        externals=(
            ExternalInput("model.input_ids", "input_ids", "caller"),
            ExternalInput("model.attention_mask", "attention_mask", "generated"),
            ExternalInput("model.position_ids", "position_ids", "generated"),
        ),
        outputs=("model.logits",),
    )
