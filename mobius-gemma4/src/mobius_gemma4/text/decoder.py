"""The ``decoder`` graph of the split package (docs/gemma4.md §8.1).

``inputs_embeds`` (+ ``per_layer_inputs``) → layer stack → norm → ``lm_head`` → softcap.
With the ``"vision"`` mask overlay it also takes ``input_ids`` to find image blocks.
The decoder holds its own ``lm_head.weight`` in the checkpoint's ``[V, H]`` layout (a
copy of ``embed_tokens`` for tied checkpoints), so the two graphs stay independent files;
logits are one ``Gemm(transB=1)`` on ``[B·S, H]`` (:func:`mobius.components.linear_transposed`). Keeping the
checkpoint layout lets the package writer stream the 0.8 GB table in chunks instead of
materializing a transposed copy.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import linear_transposed
from mobius.components.dtypes import ir_dtype
from mobius.components.graph import finish_model, new_graph
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE
from mobius_gemma4.config import Gemma4TextConfig
from mobius_gemma4.ports import decoder_ports
from mobius_gemma4.text.graph_io import declare_inputs, declare_outputs, inline_constants
from mobius_gemma4.text.masks import image_block_ids
from mobius_gemma4.text.stack import Gemma4TextStack, softcap


class Gemma4Decoder(nn.Module):
    def __init__(
        self,
        cfg: Gemma4TextConfig,
        dtype: ir.DataType,
        block_token_ids: tuple[int, ...] = (),
        target: str = "default",
        overlay_full_layers: bool = False,
    ) -> None:
        super().__init__("")
        self.cfg = cfg
        self.block_token_ids = block_token_ids
        self.stack = Gemma4TextStack(
            cfg,
            dtype,
            target,
            overlay=bool(block_token_ids),
            overlay_full_layers=overlay_full_layers,
        )
        self.lm_head = nn.Parameter(
            [cfg.vocab_size, cfg.hidden_size], dtype=dtype, name="lm_head.weight"
        )

    def forward(self, op, ins):
        cfg = self.cfg
        blocks = None
        if self.block_token_ids:
            blocks = image_block_ids(op, ins["input_ids"], self.block_token_ids)
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
            image_blocks=blocks,
        )
        logits = linear_transposed(op, h, self.lm_head, cfg.vocab_size)
        out = {"logits": softcap(op, logits, cfg.final_logit_softcapping)}
        for i, (k, v) in present.items():
            out[f"present.{i}.key"], out[f"present.{i}.value"] = k, v
        return out


def build_decoder(
    cfg: Gemma4TextConfig,
    build_dtype: str,
    *,
    block_token_ids: tuple[int, ...] = (),
    target: str = "default",
    overlay_full_layers: bool = False,
) -> ir.Model:
    """``block_token_ids`` (image, video placeholders) turn on the ``"vision"`` mask overlay:
    the graph then takes ``input_ids`` to find image blocks. ``overlay_full_layers`` puts it
    on full layers too, ORed after the window (``gemma4_unified``, see text.masks)."""
    graph, builder, op = new_graph("gemma4_decoder")
    port_dtype = PORT_DTYPE_OF_BUILD_DTYPE[build_dtype]
    inputs, outputs = decoder_ports(cfg, port_dtype, input_ids=bool(block_token_ids))
    ins = declare_inputs(builder, inputs)
    decoder = Gemma4Decoder(
        cfg, ir_dtype(build_dtype), block_token_ids, target, overlay_full_layers
    )
    declare_outputs(builder, outputs, decoder(op, ins))
    inline_constants(graph)
    return finish_model(graph, builder=builder)
