"""The ``embedding`` graph of the split package (docs/gemma4.md §8.2), run at every step.

``input_ids`` → placeholders (image/video/audio) mapped to ``pad_token_id`` as HF's
``Gemma4Model`` does → scaled ``embed_tokens`` lookup → ``inputs_embeds``; with PLE also
the combined ``per_layer_inputs`` from the same mapped ids and the merged embeddings.
Packages with encoders take ``image_features`` / ``audio_features`` ``[rows, H]`` and
scatter them into the placeholder positions in :func:`merge_media` before the PLE
projection (HF projects the merged embeddings; the PLE token part uses the mapped ids).
Video placeholders are mapped to pad and keep the pad embedding, as in HF without
video inputs.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components.dtypes import ir_dtype
from mobius.components.graph import finish_model, new_graph
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE
from mobius_gemma4.config import Gemma4Config, embed_scale
from mobius_gemma4.ports import embedding_ports, has_audio, has_vision
from mobius_gemma4.text.graph_io import declare_inputs, declare_outputs, inline_constants
from mobius_gemma4.text.per_layer_embeddings import Gemma4PerLayerEmbedder
from mobius_gemma4.text.primitives import ScaledEmbedding


def map_placeholders(op, ids, placeholder_ids: tuple[int, ...], pad: int):
    """``where(ids ∈ placeholders, pad, ids)``."""
    if not placeholder_ids:
        return ids
    hit = None
    for t in placeholder_ids:
        eq = op.Equal(ids, op.Constant(value_int=t))
        hit = eq if hit is None else op.Or(hit, eq)
    return op.Where(hit, op.Constant(value_int=pad), ids)


def scatter_rows(op, embeds, ids, token: int, features, hidden: int):
    """HF ``masked_scatter``: row ``k`` of ``features`` goes to the ``k``-th ``token`` position
    of the flattened ``[B·S]`` ids (batch-major). A zero row is appended so the Gather never
    sees an empty table (decode steps get ``[0, H]``); positions without ``token`` keep
    ``embeds``."""
    hit = op.Equal(ids, op.Constant(value_int=token))  # [B, S]
    flat = op.Reshape(op.Cast(hit, to=ir.DataType.INT64), op.Constant(value_ints=[-1]))
    index = op.Sub(op.CumSum(flat, op.Constant(value_int=0)), op.Constant(value_int=1))
    index = op.Max(index, op.Constant(value_int=0))
    zero_row = op.CastLike(
        op.ConstantOfShape(op.Constant(value_ints=[1, hidden])), embeds
    )  # ConstantOfShape defaults to float32 zeros
    table = op.Concat(op.CastLike(features, embeds), zero_row, axis=0)
    rows = op.Reshape(op.Gather(table, index, axis=0), op.Shape(embeds))
    return op.Where(op.Unsqueeze(hit, [2]), rows, embeds)


def merge_media(op, embeds, ids, ins, config: Gemma4Config):
    """Scatter the encoders' soft tokens into ``embeds`` (raw ``ids`` locate the placeholders)."""
    hidden = config.text.hidden_size
    if "image_features" in ins:
        embeds = scatter_rows(op, embeds, ids, config.image_token_id, ins["image_features"], hidden)
    if "audio_features" in ins:
        embeds = scatter_rows(op, embeds, ids, config.audio_token_id, ins["audio_features"], hidden)
    return embeds


class Gemma4Embedding(nn.Module):
    def __init__(self, config: Gemma4Config, build_dtype: str) -> None:
        super().__init__("")
        text, dtype = config.text, ir_dtype(build_dtype)
        self.config = config
        self.embed_tokens = ScaledEmbedding(
            text.vocab_size, text.hidden_size, embed_scale(text.hidden_size, build_dtype), dtype
        )
        if text.has_ple:
            self.ple = Gemma4PerLayerEmbedder(text, dtype, build_dtype)
            self.ple._set_name("")

    def forward(self, op, ins):
        cfg = self.config
        raw = ins["input_ids"]
        ids = map_placeholders(op, raw, cfg.placeholder_token_ids, cfg.text.pad_token_id)
        embeds = merge_media(op, self.embed_tokens(op, ids), raw, ins, cfg)
        out = {"inputs_embeds": embeds}
        if cfg.text.has_ple:
            out["per_layer_inputs"] = self.ple(op, ids, embeds)
        return out


def build_embedding(config: Gemma4Config, build_dtype: str) -> ir.Model:
    graph, builder, op = new_graph("gemma4_embedding")
    inputs, outputs = embedding_ports(
        config.text,
        PORT_DTYPE_OF_BUILD_DTYPE[build_dtype],
        image=has_vision(config),
        audio=has_audio(config),
    )
    ins = declare_inputs(builder, inputs)
    declare_outputs(builder, outputs, Gemma4Embedding(config, build_dtype)(op, ins))
    inline_constants(graph)
    return finish_model(graph, builder=builder)
