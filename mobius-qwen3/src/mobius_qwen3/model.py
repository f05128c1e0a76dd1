"""The ``model`` graph of Qwen3 / Qwen3-MoE, read op for op against HF 5.24 ``modeling_qwen3``.

Per layer (``Qwen3DecoderLayer``)::

    h = h + o_proj(attn(rope(q_norm(q_proj(x))), rope(k_norm(k_proj(x))), v_proj(x)))
        with x = input_layernorm(h)
    h = h + mlp(post_attention_layernorm(h))    # mlp: GatedMLP, or routed experts on
                                                # the sparse layers of qwen3_moe

q_norm / k_norm are RMSNorms over each head's ``head_dim`` (applied on ``[B, S, heads,
hd]`` before RoPE); RMSNorm multiplies its weight after the cast back to the input
dtype, as ``Qwen3RMSNorm`` does. The head is ``norm`` then ``h @ Wᵀ`` with W the
``[V, H]`` embedding table (tied) or ``lm_head.weight`` as stored (untied), one Gemm.

Everything is a shared :mod:`mobius.components` piece: Linear (optional bias),
RMSNorm, GatedMLP, rope_inv_freq / rotary_cos_sin / apply_rotary, allowed_positions,
Attention / GroupQueryAttention + gqa_lengths, linear_transposed, routed experts.

Attention op per layer: ``--target default`` uses ONNX ``Attention`` with the boolean
causal (+ window) mask of :func:`mobius.components.allowed_positions`. ``cpu`` / ``cuda``
use ``com.microsoft.GroupQueryAttention`` on every layer when the target has a kernel
for the build dtype (:func:`mobius.components.gqa_available`): Qwen3's masks are plain
causal, windowed on sliding layers (``local_window_size = W``, onnxruntime counts the
current token as HF's ``sliding_window`` does), which GroupQueryAttention expresses
exactly for right-padded batches. q and k are rotated before it (``do_rotary = 0``).
"""

from __future__ import annotations

import logging

import onnx_ir as ir
from onnxscript import nn

from mobius.components import (
    Attention,
    Embedding,
    GatedMLP,
    GroupQueryAttention,
    Linear,
    RMSNorm,
    add_input,
    add_output,
    allowed_positions,
    apply_rotary,
    finish_model,
    gqa_available,
    gqa_lengths,
    ir_dtype,
    linear_transposed,
    new_graph,
    rope_inv_freq,
    rotary_cos_sin,
)
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE
from mobius_qwen3.config import FULL, Qwen3Config
from mobius_qwen3.moe import Qwen3SparseMoe
from mobius_qwen3.ports import model_ports

log = logging.getLogger("mobius_qwen3")

ATTENTION, GQA = "Attention", "GroupQueryAttention"


class Qwen3Attention(nn.Module):
    """One layer's self-attention; ``forward`` returns ``(out, present_key, present_value)``.

    ``mask`` is the bool ``[B, 1, S, T]`` mask on the ``Attention`` path and the
    ``(seqlens_k, total_sequence_length)`` pair of ``gqa_lengths`` on the GQA path.
    """

    def __init__(self, cfg: Qwen3Config, i: int, dtype: ir.DataType, path: str) -> None:
        super().__init__()
        H, nh, kvh, hd = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        bias, eps = cfg.attention_bias, cfg.rms_norm_eps
        self.nh, self.kvh, self.hd, self.path = nh, kvh, hd, path
        self.q_proj = Linear(H, nh * hd, bias, dtype=dtype)
        self.k_proj = Linear(H, kvh * hd, bias, dtype=dtype)
        self.v_proj = Linear(H, kvh * hd, bias, dtype=dtype)
        self.o_proj = Linear(nh * hd, H, bias, dtype=dtype)
        self.q_norm = RMSNorm(hd, eps, weight_after_cast=True, dtype=dtype)
        self.k_norm = RMSNorm(hd, eps, weight_after_cast=True, dtype=dtype)
        if path == GQA:
            window = cfg.window(i)
            self.core = GroupQueryAttention(
                nh, kvh, hd, local_window_size=window if window is not None else -1
            )
        else:
            self.core = Attention(nh, kvh, hd, softmax_float32=dtype != ir.DataType.FLOAT)

    def _normed(self, op, x, norm, heads: int):
        # [B, S, heads·hd] -> per-head RMSNorm -> [B, S, heads·hd]
        split = op.Reshape(x, op.Constant(value_ints=[0, 0, heads, self.hd]))
        return op.Reshape(norm(op, split), op.Constant(value_ints=[0, 0, heads * self.hd]))

    def forward(self, op, x, cos, sin, mask, past_key, past_value):
        q = self._normed(op, self.q_proj(op, x), self.q_norm, self.nh)
        k = self._normed(op, self.k_proj(op, x), self.k_norm, self.kvh)
        q = apply_rotary(op, q, cos, sin, num_heads=self.nh)
        k = apply_rotary(op, k, cos, sin, num_heads=self.kvh)
        v = self.v_proj(op, x)
        if self.path == GQA:
            seqlens_k, total = mask
            y, pk, pv = self.core(op, q, k, v, past_key, past_value, seqlens_k, total)
        else:
            y, pk, pv = self.core(op, q, k, v, mask, past_key, past_value)
        return self.o_proj(op, y), pk, pv


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, i: int, dtype: ir.DataType, path: str) -> None:
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Qwen3Attention(cfg, i, dtype, path)
        if cfg.sparse_layers[i]:
            self.mlp = Qwen3SparseMoe(cfg, dtype)
        else:
            self.mlp = GatedMLP(H, cfg.intermediate_size, cfg.hidden_act, dtype=dtype)
        self.input_layernorm = RMSNorm(H, eps, weight_after_cast=True, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(H, eps, weight_after_cast=True, dtype=dtype)

    def forward(self, op, h, cos, sin, mask, past_key, past_value):
        a, pk, pv = self.self_attn(
            op, self.input_layernorm(op, h), cos, sin, mask, past_key, past_value
        )
        h = op.Add(h, a)
        h = op.Add(h, self.mlp(op, self.post_attention_layernorm(op, h)))
        return h, pk, pv


def attention_path(cfg: Qwen3Config, target: str, dtype: ir.DataType) -> str:
    """:data:`GQA` where the target has a kernel for ``dtype``, else :data:`ATTENTION`."""
    if gqa_available(target, dtype):
        return GQA
    if target != "default":
        log.info(
            "target %s, dtype %s: onnxruntime has no GroupQueryAttention kernel for this "
            "dtype; every layer keeps the ONNX Attention path",
            target,
            dtype.name.lower(),
        )
    return ATTENTION


class Qwen3CausalLM(nn.Module):
    """Parameters under HF's names without the ``model.`` prefix (``layers.0.…``,
    ``embed_tokens.weight``, ``norm.weight``, ``lm_head.weight``)."""

    def __init__(self, cfg: Qwen3Config, dtype: ir.DataType, target: str = "default") -> None:
        super().__init__("")
        self.cfg, self.dtype = cfg, dtype
        self.path = attention_path(cfg, target, dtype)
        log.info("qwen3 target %s: %s on all %d layers", target, self.path, cfg.num_hidden_layers)
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            [Qwen3DecoderLayer(cfg, i, dtype, self.path) for i in range(cfg.num_hidden_layers)]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, weight_after_cast=True, dtype=dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Parameter(
                [cfg.vocab_size, cfg.hidden_size], dtype=dtype, name="lm_head.weight"
            )

    def _masks(self, op, attention_mask, h):
        if self.path == GQA:
            lengths = gqa_lengths(op, attention_mask)
            return {t: lengths for t in set(self.cfg.layer_types)}
        return {
            t: allowed_positions(
                op,
                attention_mask,
                h,
                sliding_window=None if t == FULL else self.cfg.sliding_window,
            )
            for t in sorted(set(self.cfg.layer_types))
        }

    def forward(self, op, ins):
        cfg = self.cfg
        h = self.embed_tokens(op, ins["input_ids"])
        masks = self._masks(op, ins["attention_mask"], h)
        inv_freq, scaling = rope_inv_freq(
            cfg.rope.as_dict(), cfg.head_dim, cfg.max_position_embeddings
        )
        cos, sin = rotary_cos_sin(op, inv_freq, ins["position_ids"], self.dtype, scaling=scaling)
        out = {}
        for i, layer in enumerate(self.layers):
            h, pk, pv = layer(
                op,
                h,
                cos,
                sin,
                masks[cfg.layer_types[i]],
                ins[f"past_key_values.{i}.key"],
                ins[f"past_key_values.{i}.value"],
            )
            out[f"present.{i}.key"], out[f"present.{i}.value"] = pk, pv
        h = self.norm(op, h)
        head = self.embed_tokens.weight if cfg.tie_word_embeddings else self.lm_head
        out["logits"] = linear_transposed(op, h, head, cfg.vocab_size)
        return out


def build_model(cfg: Qwen3Config, build_dtype: str, target: str = "default") -> ir.Model:
    """The ``model`` graph of the contract (ports from :mod:`mobius_qwen3.ports`)."""
    graph, builder, op = new_graph(cfg.model_type)
    inputs, outputs = model_ports(cfg, PORT_DTYPE_OF_BUILD_DTYPE[build_dtype])
    ins = {name: add_input(builder, name, dtype, shape) for name, dtype, shape in inputs}
    values = Qwen3CausalLM(cfg, ir_dtype(build_dtype), target)(op, ins)
    for name, dtype, shape in outputs:
        add_output(builder, values[name], name, dtype=dtype, shape=shape)
    return finish_model(graph, builder=builder)
