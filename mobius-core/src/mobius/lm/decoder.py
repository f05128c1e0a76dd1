"""The Llama-shaped decoder LM (Llama, Mistral, Qwen3 & co.), read op for op against HF 5.24.

Per layer::

    h = h + o_proj(attn(rope([q_norm](q_proj(x))), rope([k_norm](k_proj(x))), v_proj(x)))
        with x = input_layernorm(h)
    h = h + mlp(post_attention_layernorm(h))

The optional q_norm / k_norm (Qwen3) are RMSNorms over each head's ``head_dim``, applied
on ``[B, S, heads, hd]`` before RoPE. Every RMSNorm multiplies its weight after the cast
back to the input dtype (``LlamaRMSNorm``). ``mlp`` is :class:`GatedMLP` unless the
family gives its own block per layer (Qwen3-MoE's routed experts). The head is ``norm``
then ``h @ Wᵀ`` with W the ``[V, H]`` embedding table (tied) or ``lm_head.weight`` as
stored (untied), one Gemm.

Attention op per layer (:func:`attention_path`): ``--target default`` uses ONNX
``Attention`` with the boolean causal (+ window) mask of
:func:`mobius.components.allowed_positions`. ``cpu`` / ``cuda`` use
``com.microsoft.GroupQueryAttention`` on every layer when the target has a kernel for the
build dtype: these masks are plain causal, windowed on sliding layers
(``local_window_size = W``: onnxruntime counts the current token as HF's
``sliding_window`` does), which GroupQueryAttention expresses exactly for right-padded
batches. q and k are rotated before it (``do_rotary = 0``).

RMSNorms (:func:`mobius.components.fused_rmsnorm_available`): ``--target cpu`` float32
builds write each as one ONNX ``RMSNormalization`` node, and each
residual add with the norm that follows it as one ``SkipSimplifiedLayerNormalization``:
a layer hands its MLP output on unadded (``pending``) and the next layer's
``input_layernorm`` (or the final ``norm``) adds it. Other targets and dtypes keep the
explicit op chain and Adds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import onnx_ir as ir
from onnxscript import nn

from mobius.components import (
    Attention,
    Embedding,
    GatedMLP,
    GroupQueryAttention,
    Linear,
    RMSNorm,
    allowed_positions,
    apply_rotary,
    fused_rmsnorm_available,
    gqa_available,
    gqa_lengths,
    ir_dtype,
    linear_transposed,
    rope_inv_freq,
    rotary_cos_sin,
)
from mobius.lm.config import FULL, DecoderConfig, RopeParams
from mobius.lm.ports import LMShape, build_graph, kv_port, lm_ports
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE

log = logging.getLogger("mobius.lm")

ATTENTION, GQA = "Attention", "GroupQueryAttention"


def attention_path(target: str, dtype: str | ir.DataType, *, family: str, layers: int) -> str:
    """:data:`GQA` where ``target`` has a GroupQueryAttention kernel for ``dtype``, else
    :data:`ATTENTION`; the choice and its reason are logged (logger ``mobius.lm``)."""
    return attention_paths(target, dtype, family=family, gqa_exact=(True,) * layers)[0]


def attention_paths(
    target: str, dtype: str | ir.DataType, *, family: str, gqa_exact: Sequence[bool]
) -> tuple[str, ...]:
    """The attention op of each layer: :data:`GQA` where ``target`` has a
    GroupQueryAttention kernel for ``dtype`` and ``gqa_exact[i]`` (GroupQueryAttention
    expresses layer ``i``'s mask exactly: causal, optionally windowed), else
    :data:`ATTENTION`. The choice and its reason are logged (logger ``mobius.lm``)."""
    dt = ir_dtype(dtype)
    kernel = gqa_available(target, dt)
    if not kernel and target != "default":
        log.info(
            "target %s, dtype %s: onnxruntime has no GroupQueryAttention kernel for this "
            "dtype; every layer keeps the ONNX Attention path",
            target,
            dt.name.lower(),
        )
    paths = tuple(GQA if kernel and exact else ATTENTION for exact in gqa_exact)
    log.info("%s target %s: %s", family, target, describe_paths(paths))
    return paths


def describe_paths(paths: Sequence[str]) -> str:
    """``"GroupQueryAttention on all 6 layers"``, or per op the layers using it
    (``"GroupQueryAttention: layers 0, 1; Attention: layers 2"``)."""
    if len(set(paths)) == 1:
        return f"{paths[0]} on all {len(paths)} layers"
    return "; ".join(
        f"{kind}: layers {', '.join(str(i) for i, p in enumerate(paths) if p == kind)}"
        for kind in (GQA, ATTENTION)
    )


def decoder_shape(cfg: DecoderConfig) -> LMShape:
    """Every layer owns a ``[batch, num_key_value_heads, T, head_dim]`` cache."""
    return LMShape.uniform(
        cfg.vocab_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    )


class SelfAttention(nn.Module):
    """One layer's self-attention; ``forward(op, x, cos, sin, mask, past_key, past_value)
    -> (out, present_key, present_value)``.

    ``mask`` is the bool ``[B, 1, S, T]`` mask on the ``Attention`` path and the
    ``(seqlens_k, total_sequence_length)`` pair of ``gqa_lengths`` on the GQA path.
    """

    def __init__(
        self,
        cfg: DecoderConfig,
        i: int,
        dtype: ir.DataType,
        path: str,
        *,
        qk_norm: bool,
        fused_norms: bool = False,
    ) -> None:
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
        norm = dict(weight_after_cast=True, dtype=dtype, fused=fused_norms)
        self.q_norm = RMSNorm(hd, eps, **norm) if qk_norm else None
        self.k_norm = RMSNorm(hd, eps, **norm) if qk_norm else None
        if path == GQA:
            window = cfg.window(i)
            self.core = GroupQueryAttention(
                nh, kvh, hd, local_window_size=window if window is not None else -1
            )
        else:
            self.core = Attention(nh, kvh, hd, softmax_float32=dtype != ir.DataType.FLOAT)

    def _normed(self, op, x, norm, heads: int):
        if norm is None:
            return x
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


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP with residuals; children ``self_attn``, ``mlp``,
    ``input_layernorm``, ``post_attention_layernorm`` (HF's names).

    ``forward(op, h, cos, sin, mask, past_key, past_value, pending=None) -> (h, pending,
    present_key, present_value)``: the residual stream is ``h + pending`` (``pending``
    None: ``h``). Unfused the layer returns ``pending = None``; with ``fused_norms`` it
    returns its MLP output as ``pending``, for the next norm to add in one fused node.
    """

    def __init__(
        self,
        cfg: DecoderConfig,
        self_attn: SelfAttention,
        mlp: nn.Module,
        dtype: ir.DataType,
        *,
        fused_norms: bool = False,
    ) -> None:
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = self_attn
        self.mlp = mlp
        self.fused_norms = fused_norms
        norm = dict(weight_after_cast=True, dtype=dtype, fused=fused_norms)
        self.input_layernorm = RMSNorm(H, eps, **norm)
        self.post_attention_layernorm = RMSNorm(H, eps, **norm)

    def forward(self, op, h, cos, sin, mask, past_key, past_value, pending=None):
        x, h = self.input_layernorm.residual(op, h, pending)
        a, pk, pv = self.self_attn(op, x, cos, sin, mask, past_key, past_value)
        x, h = self.post_attention_layernorm.residual(op, h, a)
        m = self.mlp(op, x)
        if self.fused_norms:
            return h, m, pk, pv
        return op.Add(h, m), None, pk, pv


MlpFactory = Callable[[DecoderConfig, int, ir.DataType], nn.Module]


def gated_mlp(cfg: DecoderConfig, i: int, dtype: ir.DataType) -> nn.Module:
    """The default :data:`MlpFactory`: ``GatedMLP(hidden, intermediate, act, bias=mlp_bias)``."""
    return GatedMLP(
        cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, bias=cfg.mlp_bias, dtype=dtype
    )


class DecoderLM(nn.Module):
    """The whole ``model`` graph body. Parameters under HF's names without the ``model.``
    prefix (``layers.0.…``, ``embed_tokens.weight``, ``norm.weight``, ``lm_head.weight``).

    ``forward(op, ins)`` takes the :func:`mobius.lm.lm_ports` inputs by name and returns
    ``logits`` and every ``present.{i}.*`` by name.
    """

    def __init__(
        self,
        cfg: DecoderConfig,
        dtype: ir.DataType,
        target: str = "default",
        *,
        family: str,
        qk_norm: bool = False,
        mlp: MlpFactory = gated_mlp,
        logits: str = "all",
    ) -> None:
        super().__init__("")
        self.cfg, self.dtype = cfg, dtype
        self.last_only = logits == "last"
        self.path = attention_path(target, dtype, family=family, layers=cfg.num_hidden_layers)
        self.fused_norms = fused = fused_rmsnorm_available(target, dtype)
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            [
                DecoderLayer(
                    cfg,
                    SelfAttention(cfg, i, dtype, self.path, qk_norm=qk_norm, fused_norms=fused),
                    mlp(cfg, i, dtype),
                    dtype,
                    fused_norms=fused,
                )
                for i in range(cfg.num_hidden_layers)
            ]
        )
        self.norm = RMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, weight_after_cast=True, dtype=dtype, fused=fused
        )
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
        rotary = self.rotary(op, ins["position_ids"])
        out, pending = {}, None
        for i, layer in enumerate(self.layers):
            names = [kv_port(i, kind) for kind in ("key", "value")]
            kind = cfg.layer_types[i]
            h, pending, pk, pv = layer(
                op, h, *rotary[kind], masks[kind], ins[names[0]], ins[names[1]], pending
            )
            out[kv_port(i, "key", present=True)] = pk
            out[kv_port(i, "value", present=True)] = pv
        if self.last_only:  # the head (and its norm) on the last position alone
            h = self._last(op, h)
            pending = None if pending is None else self._last(op, pending)
        out["logits"] = self.logits(op, h, pending)
        return out

    @staticmethod
    def _last(op, h):
        return op.Slice(h, op.Constant(value_ints=[-1]), op.Constant(value_ints=[2**63 - 1]),
                        op.Constant(value_ints=[1]))  # fmt: skip

    def rotary(self, op, position_ids) -> dict[str, tuple[ir.Value, ir.Value]]:
        """``(cos, sin)`` per layer type: ``cfg.rope`` for all (a family with one rope per
        layer type overrides this, e.g. :class:`mobius.lm.gemma.GemmaDecoderLM`)."""
        cos_sin = self.cos_sin(op, self.cfg.rope, position_ids)
        return dict.fromkeys(set(self.cfg.layer_types), cos_sin)

    def cos_sin(self, op, rope: RopeParams, position_ids, name: str = "rope"):
        """``(cos, sin)`` of one rope, computed in the graph from ``position_ids``."""
        cfg = self.cfg
        inv_freq, scaling = rope_inv_freq(rope.as_dict(), cfg.head_dim, cfg.max_position_embeddings)
        return rotary_cos_sin(op, inv_freq, position_ids, self.dtype, scaling=scaling, name=name)

    def logits(self, op, h, pending=None):
        """``norm`` of ``h + pending`` (``pending`` None: of ``h``) then the head:
        ``[B, S, V]`` logits."""
        h = self.norm.residual(op, h, pending)[0]
        head = self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head
        return linear_transposed(op, h, head, self.cfg.vocab_size)


def build_decoder(
    cfg: DecoderConfig,
    build_dtype: str,
    target: str = "default",
    *,
    family: str,
    qk_norm: bool = False,
    mlp: MlpFactory = gated_mlp,
    logits: str = "all",
) -> ir.Model:
    """The ``model`` graph of :func:`mobius.lm.lm_contract` for ``decoder_shape(cfg)``
    (``logits``: ``"all"`` positions or the ``"last"`` one, see :func:`mobius.lm.lm_ports`)."""
    port_dtype = PORT_DTYPE_OF_BUILD_DTYPE[build_dtype]
    inputs, outputs = lm_ports(decoder_shape(cfg), port_dtype, logits)
    module = DecoderLM(
        cfg, ir_dtype(build_dtype), target, family=family, qk_norm=qk_norm, mlp=mlp, logits=logits
    )
    return build_graph(cfg.model_type, inputs, outputs, module)
