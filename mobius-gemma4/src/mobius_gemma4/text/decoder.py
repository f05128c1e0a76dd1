"""The ``decoder`` graph of the split package (reference §8.1).

``inputs_embeds`` (+ ``per_layer_inputs``) → layer stack → norm → ``lm_head`` → softcap.
The decoder holds its own ``lm_head.weight`` ``[H, V]`` (a transposed copy of
``embed_tokens`` for tied checkpoints), so the two graphs stay independent files.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components.dtypes import ir_dtype
from mobius.components.graph import finish_model, new_graph
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE
from mobius_gemma4.config import Gemma4TextConfig
from mobius_gemma4.ports import decoder_ports
from mobius_gemma4.text.graph_io import declare_inputs, declare_outputs, inline_constants
from mobius_gemma4.text.stack import Gemma4TextStack, softcap


class Gemma4Decoder(nn.Module):
    def __init__(self, cfg: Gemma4TextConfig, dtype: ir.DataType) -> None:
        super().__init__("")
        self.cfg = cfg
        self.stack = Gemma4TextStack(cfg, dtype)
        self.lm_head = nn.Parameter(
            [cfg.hidden_size, cfg.vocab_size], dtype=dtype, name="lm_head.weight"
        )

    def forward(self, op, ins):
        cfg = self.cfg
        past = {
            i: (ins[f"past_key_values.{i}.key"], ins[f"past_key_values.{i}.value"])
            for i in range(cfg.num_cache_layers)
        }
        h, present = self.stack(
            op,
            ins["inputs_embeds"],
            ins["attention_mask"],
            ins["position_ids"],
            past,
            ins.get("per_layer_inputs"),
        )
        out = {"logits": softcap(op, op.MatMul(h, self.lm_head), cfg.final_logit_softcapping)}
        for i, (k, v) in present.items():
            out[f"present.{i}.key"], out[f"present.{i}.value"] = k, v
        return out


def build_decoder(cfg: Gemma4TextConfig, build_dtype: str) -> ir.Model:
    graph, builder, op = new_graph("gemma4_decoder")
    inputs, outputs = decoder_ports(cfg, PORT_DTYPE_OF_BUILD_DTYPE[build_dtype])
    ins = declare_inputs(builder, inputs)
    declare_outputs(builder, outputs, Gemma4Decoder(cfg, ir_dtype(build_dtype))(op, ins))
    inline_constants(graph)
    return finish_model(graph, builder=builder)
