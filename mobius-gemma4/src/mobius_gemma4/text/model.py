"""The Gemma 4 text graphs: the single ``model`` (``gemma4_text``) and the ``embedding`` /
``decoder`` split of the multimodal packages (docs/gemma4.md §8), read top-down.

- ``model``: input_ids → scaled ``embed_tokens`` (+ PLE from the raw ids) → layer stack →
  norm → head → softcap. A tied head reuses ``embed_tokens.weight`` through one
  ``Gemm(transB=1)`` (:func:`mobius.components.linear_transposed`); an untied
  checkpoint's ``lm_head.weight`` is a separate ``[H, V]`` initializer.
- ``embedding`` (run at every step): placeholders (image/video/audio) mapped to
  ``pad_token_id`` as HF's ``Gemma4Model`` does → scaled lookup → the encoders' soft tokens
  scattered into their placeholder positions (:func:`mobius.components.scatter_rows`; the
  raw ids locate them) → ``inputs_embeds``; with PLE also ``per_layer_inputs`` from the
  mapped ids and the merged embeddings (HF projects the merged embeddings). Video
  placeholders keep the pad embedding, as in HF without video inputs.
- ``decoder``: ``inputs_embeds`` (+ ``per_layer_inputs``) → stack → norm → ``lm_head`` →
  softcap. It holds its own ``lm_head.weight`` in the checkpoint's ``[V, H]`` layout (a copy
  of ``embed_tokens`` for tied checkpoints), so the two graphs stay independent files and
  the package writer streams the table in chunks instead of materializing a transpose.

The stack builds each layer type's mask (or, for GroupQueryAttention layers,
``seqlens_k`` / ``total_sequence_length``) and cos/sin once, runs every layer and wires KV
sharing: a consumer reads the post-update K/V of the last cache-owning layer of its type.
Caches are BNSH ``[B, kvh_i, T, hd_i]`` on both attention paths, so the ports
(:mod:`mobius_gemma4.ports`, KV names from :func:`mobius.lm.kv_port`) do not depend on the
target.

Masks (docs/gemma4.md §4): full layers are causal, sliding layers add the window (W keys
including self), padding keys are dropped (:func:`mobius.components.allowed_positions`).
``use_bidirectional_attention = "vision"`` (HF 5.24 ``create_masks_for_vision_model``): full
layers stay causal; sliding layers become ``(causal ∨ same_block) ∧ window`` with the image
blocks of :func:`mobius.components.block_ids` (past keys are no block, so decode steps are
plain causal). ``gemma4_unified`` (HF ``create_masks_for_generate`` with
``block_sequence_ids``): the overlay is on every layer and ORed last — ``causal ∨
same_block`` and ``(causal ∧ window) ∨ same_block`` (``overlay_full_layers``).

RoPE: :func:`mobius.components.rope_inv_freq` computes HF 5.24's ``default`` (sliding) and
``proportional`` (full) tables bit for bit — proportional rotates ``int(p·hd/2)`` pairs with
the full head dim as exponent denominator, zero-padded to ``hd/2`` — and cos/sin are formed
in the graph from ``position_ids`` (no ``[max_positions, hd/2]`` tables).

Attention op per layer (:func:`attention_paths`): ``--target default`` keeps ONNX
``Attention``; ``cpu`` / ``cuda`` use GroupQueryAttention wherever it computes exactly what
HF does — the target has a kernel for the build dtype and the layer's mask is plain causal
(+ window): not on the sliding layers of a ``"vision"``-overlay decoder, on no layer of a
unified one. The split is logged (logger ``mobius.lm``).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import (
    RMSNorm,
    ScaledEmbedding,
    allowed_positions,
    block_ids,
    embed_scale,
    gqa_lengths,
    ir_dtype,
    linear_transposed,
    logit_softcap,
    map_placeholders,
    rope_inv_freq,
    rotary_cos_sin,
    same_block,
    scatter_rows,
)
from mobius.lm.decoder import ATTENTION, GQA
from mobius.lm.decoder import attention_paths as core_attention_paths
from mobius.lm.ports import build_graph, kv_port
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE
from mobius_gemma4.config import FULL, Gemma4Config, Gemma4TextConfig
from mobius_gemma4.ports import decoder_ports, embedding_ports, has_audio, has_vision, model_ports
from mobius_gemma4.text.layers import Gemma4DecoderLayer, PerLayerEmbedder


def build_causal_lm(
    cfg: Gemma4TextConfig, build_dtype: str, target: str = "default", *, logits: str = "all"
) -> ir.Model:
    """The ``model`` graph of ``gemma4_text`` (``logits="last"``: the head on the last
    position only)."""
    inputs, outputs = model_ports(cfg, PORT_DTYPE_OF_BUILD_DTYPE[build_dtype], logits)
    module = Gemma4CausalLM(cfg, ir_dtype(build_dtype), target, last_only=logits == "last")
    return _graph("gemma4_text", inputs, outputs, module)


def last_position(op, h):
    """``h[:, -1:, :]``: the hidden state the head reads under ``logits="last"``."""
    return op.Slice(h, op.Constant(value_ints=[-1]), op.Constant(value_ints=[2**63 - 1]),
                    op.Constant(value_ints=[1]))  # fmt: skip


def build_embedding(config: Gemma4Config, build_dtype: str) -> ir.Model:
    """The ``embedding`` graph of a multimodal package."""
    port_dtype = PORT_DTYPE_OF_BUILD_DTYPE[build_dtype]
    inputs, outputs = embedding_ports(
        config.text, port_dtype, image=has_vision(config), audio=has_audio(config)
    )
    module = Gemma4Embedding(config, ir_dtype(build_dtype))
    return _graph("gemma4_embedding", inputs, outputs, module)


def build_decoder(
    cfg: Gemma4TextConfig,
    build_dtype: str,
    *,
    block_token_ids: tuple[int, ...] = (),
    target: str = "default",
    overlay_full_layers: bool = False,
    logits: str = "all",
) -> ir.Model:
    """The ``decoder`` graph. ``block_token_ids`` (image, video placeholders) turn on the
    ``"vision"`` mask overlay: the graph then takes ``input_ids`` to find image blocks;
    ``overlay_full_layers`` puts it on full layers too (``gemma4_unified``);
    ``logits="last"``: the head on the last position only."""
    inputs, outputs = decoder_ports(
        cfg, PORT_DTYPE_OF_BUILD_DTYPE[build_dtype], input_ids=bool(block_token_ids), logits=logits
    )
    module = Gemma4Decoder(
        cfg, ir_dtype(build_dtype), block_token_ids, target, overlay_full_layers, logits == "last"
    )
    return _graph("gemma4_decoder", inputs, outputs, module)


class Gemma4CausalLM(nn.Module):
    def __init__(
        self, cfg: Gemma4TextConfig, dtype: ir.DataType, target: str, last_only: bool = False
    ) -> None:
        super().__init__("")
        self.cfg = cfg
        self.last_only = last_only
        H = cfg.hidden_size
        self.embed_tokens = ScaledEmbedding(cfg.vocab_size, H, embed_scale(H, dtype), dtype=dtype)
        if cfg.has_ple:
            self.ple = PerLayerEmbedder(cfg, dtype)
        self.stack = Gemma4TextStack(cfg, dtype, target)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Parameter([H, cfg.vocab_size], dtype=dtype, name="lm_head.weight")

    def forward(self, op, ins):
        cfg = self.cfg
        ids = ins["input_ids"]
        h = self.embed_tokens(op, ids)
        ple = self.ple(op, ids, h) if cfg.has_ple else None
        h, out = self.stack(op, h, ins, ple)
        if self.last_only:
            h = last_position(op, h)
        if cfg.tie_word_embeddings:
            logits = linear_transposed(op, h, self.embed_tokens.weight, cfg.vocab_size)
        else:
            logits = op.MatMul(h, self.lm_head)
        out["logits"] = logit_softcap(op, logits, cfg.final_logit_softcapping)
        return out


class Gemma4Embedding(nn.Module):
    def __init__(self, config: Gemma4Config, dtype: ir.DataType) -> None:
        super().__init__("")
        text = config.text
        self.config = config
        H = text.hidden_size
        self.embed_tokens = ScaledEmbedding(text.vocab_size, H, embed_scale(H, dtype), dtype=dtype)
        if text.has_ple:
            self.ple = PerLayerEmbedder(text, dtype)

    def forward(self, op, ins):
        cfg, H = self.config, self.config.text.hidden_size
        raw = ins["input_ids"]
        ids = map_placeholders(op, raw, cfg.placeholder_token_ids, cfg.text.pad_token_id)
        embeds = self.embed_tokens(op, ids)
        for port, token in (
            ("image_features", cfg.image_token_id),
            ("audio_features", cfg.audio_token_id),
        ):
            if port in ins:
                embeds = scatter_rows(op, embeds, raw, token, ins[port], H)
        out = {"inputs_embeds": embeds}
        if cfg.text.has_ple:
            out["per_layer_inputs"] = self.ple(op, ids, embeds)
        return out


class Gemma4Decoder(nn.Module):
    def __init__(
        self,
        cfg: Gemma4TextConfig,
        dtype: ir.DataType,
        block_token_ids: tuple[int, ...],
        target: str,
        overlay_full_layers: bool,
        last_only: bool = False,
    ) -> None:
        super().__init__("")
        self.cfg = cfg
        self.last_only = last_only
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
            blocks = block_ids(op, ins["input_ids"], self.block_token_ids)
        h, out = self.stack(op, ins["inputs_embeds"], ins, ins.get("per_layer_inputs"), blocks)
        if self.last_only:
            h = last_position(op, h)
        logits = linear_transposed(op, h, self.lm_head, cfg.vocab_size)
        out["logits"] = logit_softcap(op, logits, cfg.final_logit_softcapping)
        return out


def attention_paths(
    cfg: Gemma4TextConfig,
    target: str,
    dtype: ir.DataType,
    overlay: bool = False,
    overlay_full_layers: bool = False,
) -> tuple[str, ...]:
    """:data:`ATTENTION` or :data:`GQA` per layer (module doc): GroupQueryAttention cannot
    express the image-block overlay, which sits on sliding layers (``overlay``) or on every
    layer (``overlay_full_layers``)."""
    exact = tuple(not overlay or (t == FULL and not overlay_full_layers) for t in cfg.layer_types)
    return core_attention_paths(target, dtype, family="gemma4", gqa_exact=exact)


class Gemma4TextStack(nn.Module):
    """``layers.*`` + ``norm`` under their HF names (prefix-free, like the initializers).

    ``forward(op, h, ins, ple=None, blocks=None) -> (normed h, {present port: value})``
    reads ``attention_mask``, ``position_ids`` and the past ports from ``ins``; ``blocks``
    are the image-block ids of the ``"vision"`` overlay (the stack must be built with
    ``overlay=True``).
    """

    def __init__(
        self,
        cfg: Gemma4TextConfig,
        dtype: ir.DataType,
        target: str = "default",
        *,
        overlay: bool = False,
        overlay_full_layers: bool = False,
    ) -> None:
        super().__init__("")
        self.cfg, self.dtype = cfg, dtype
        self.overlay_full_layers = overlay_full_layers
        self.paths = attention_paths(cfg, target, dtype, overlay, overlay_full_layers)
        self.layers = nn.ModuleList(
            [Gemma4DecoderLayer(cfg, i, dtype, self.paths[i]) for i in range(cfg.num_hidden_layers)]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)

    def forward(self, op, h, ins, ple=None, blocks=None):
        cfg = self.cfg
        masks = self._masks(op, ins["attention_mask"], h, blocks)
        rope = {t: self._cos_sin(op, t, ins["position_ids"]) for t in sorted(set(cfg.layer_types))}
        out: dict[str, ir.Value] = {}
        present: dict[int, tuple[ir.Value, ir.Value]] = {}
        for i, layer in enumerate(self.layers):
            t = cfg.layer_types[i]
            if cfg.is_kv_consumer(i):
                past = present[cfg.kv_producer(i)]
            else:
                past = (ins[kv_port(i, "key")], ins[kv_port(i, "value")])
            mask = masks[GQA] if self.paths[i] == GQA else masks[t]
            h, key, value = layer(op, h, *rope[t], mask, *past, ple)
            if not cfg.is_kv_consumer(i):
                present[i] = (key, value)
                out[kv_port(i, "key", present=True)] = key
                out[kv_port(i, "value", present=True)] = value
        return self.norm(op, h), out

    def _masks(self, op, attention_mask, h, blocks):
        """``{layer type: bool mask}`` for Attention layers, ``{GQA: lengths}`` for GQA ones."""
        masks = {}
        if ATTENTION in self.paths:
            same = None if blocks is None else same_block(op, blocks, h, attention_mask)
            full_extra = same if self.overlay_full_layers else None
            masks[FULL] = allowed_positions(op, attention_mask, h, also=full_extra)
            masks["sliding_attention"] = allowed_positions(
                op,
                attention_mask,
                h,
                sliding_window=self.cfg.sliding_window,
                also=same,
                also_within_window=not self.overlay_full_layers,
            )
        if GQA in self.paths:
            masks[GQA] = gqa_lengths(op, attention_mask)
        return masks

    def _cos_sin(self, op, layer_type: str, position_ids):
        """``(cos, sin)`` ``[B, S, hd/2]`` of one layer type's rope."""
        p = self.cfg.rope_parameters[layer_type]
        params = {
            "rope_type": p.rope_type,
            "rope_theta": p.rope_theta,
            "partial_rotary_factor": p.partial_rotary_factor,
            "factor": p.factor,
        }
        inv_freq, scaling = rope_inv_freq(params, self.cfg.layer_type_dim(layer_type))
        return rotary_cos_sin(
            op, inv_freq, position_ids, self.dtype, scaling=scaling, name=f"rope.{layer_type}"
        )


def _graph(name: str, inputs, outputs, module: nn.Module) -> ir.Model:
    """:func:`mobius.lm.ports.build_graph`, with the data-carrying initializers (axes,
    shapes, scalars, ``inv_freq``) turned into ``Constant`` nodes: onnxruntime's shape
    inference cannot read an axes tensor a package writer moved to external data.
    Parameters (no data yet) stay initializers."""
    model = build_graph(name, inputs, outputs, module)
    graph = model.graph
    inputs_ = {id(v) for v in graph.inputs}
    lifted = []
    for value in list(graph.initializers.values()):
        if value.const_value is None or id(value) in inputs_:
            continue
        graph.initializers.pop(value.name)
        lifted.append(
            ir.Node(
                "",
                "Constant",
                inputs=[],
                attributes=[ir.Attr("value", ir.AttributeType.TENSOR, value.const_value)],
                outputs=[value],
                name=f"constant/{value.name}",
            )
        )
    if lifted:
        if graph.num_nodes():
            graph.insert_before(graph.node(0), lifted)
        else:
            graph.extend(lifted)
    return model
