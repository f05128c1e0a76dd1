"""The single ``model`` graph (``gemma4_text``, docs/gemma4.md §8.4).

input_ids → scaled embedding (+ PLE from raw ids) → layer stack → norm → head → softcap.
A tied head reuses ``embed_tokens.weight`` through ``Gemm(transB=1)`` (one initializer,
:func:`mobius.components.linear_transposed`);
an untied checkpoint's ``lm_head.weight`` is a separate ``[H, V]`` initializer.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import linear_transposed
from mobius.components.dtypes import ir_dtype
from mobius.components.graph import finish_model, new_graph
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE
from mobius_gemma4.config import Gemma4TextConfig, embed_scale
from mobius_gemma4.ports import model_ports
from mobius_gemma4.text.graph_io import declare_inputs, declare_outputs, inline_constants
from mobius_gemma4.text.per_layer_embeddings import Gemma4PerLayerEmbedder
from mobius_gemma4.text.primitives import ScaledEmbedding
from mobius_gemma4.text.stack import Gemma4TextStack, softcap


class Gemma4CausalLM(nn.Module):
    def __init__(self, cfg: Gemma4TextConfig, build_dtype: str, target: str = "default") -> None:
        super().__init__("")
        dtype = ir_dtype(build_dtype)
        self.cfg = cfg
        self.embed_tokens = ScaledEmbedding(
            cfg.vocab_size, cfg.hidden_size, embed_scale(cfg.hidden_size, build_dtype), dtype
        )
        if cfg.has_ple:
            self.ple = Gemma4PerLayerEmbedder(cfg, dtype, build_dtype)
            self.ple._set_name("")  # keep HF names: embed_tokens_per_layer.weight, …
        self.stack = Gemma4TextStack(cfg, dtype, target)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Parameter(
                [cfg.hidden_size, cfg.vocab_size], dtype=dtype, name="lm_head.weight"
            )

    def forward(self, op, ins):
        cfg = self.cfg
        ids = ins["input_ids"]
        h = self.embed_tokens(op, ids)
        ple = self.ple(op, ids, h) if cfg.has_ple else None
        past = {
            i: (ins[f"past_key_values.{i}.key"], ins[f"past_key_values.{i}.value"])
            for i in range(cfg.num_cache_layers)
        }
        h, present = self.stack(op, h, ins["attention_mask"], ins["position_ids"], past, ple)
        if cfg.tie_word_embeddings:
            logits = linear_transposed(op, h, self.embed_tokens.weight, cfg.vocab_size)
        else:
            logits = op.MatMul(h, self.lm_head)
        out = {"logits": softcap(op, logits, cfg.final_logit_softcapping)}
        for i, (k, v) in present.items():
            out[f"present.{i}.key"], out[f"present.{i}.value"] = k, v
        return out


def build_causal_lm(cfg: Gemma4TextConfig, build_dtype: str, target: str = "default") -> ir.Model:
    """The ``model`` graph; ``target`` picks the attention op per layer (see ``stack``)."""
    graph, builder, op = new_graph("gemma4_text")
    inputs, outputs = model_ports(cfg, PORT_DTYPE_OF_BUILD_DTYPE[build_dtype])
    ins = declare_inputs(builder, inputs)
    values = Gemma4CausalLM(cfg, build_dtype, target)(op, ins)
    declare_outputs(builder, outputs, values)
    inline_constants(graph)
    return finish_model(graph, builder=builder)
