"""Gemma 4 self-attention: the exact ONNX ``Attention`` path and the GroupQueryAttention path.

Per layer: q = RoPE(q_norm(q_proj(x))); cache owners add k = RoPE(k_norm(k_proj(x))) and
v = v_norm(v_proj(x)) — or, on full layers of k_eq_v models, v = v_norm(raw k projection)
(taken before k_norm and RoPE). Scale is 1.0 (q/k norms replace 1/sqrt(hd)).

``Attention`` path (docs/gemma4.md §9, every target): q/k rotated by ONNX ``RotaryEmbedding`` in
BNSH, ``Attention`` appends K/V to the past with the boolean mask of the layer type; the
softmax runs in float32 (``softmax_precision``) for half-precision builds. KV consumers take
the producer's present K/V as plain K/V (no past, no cache write) with their own mask.

GroupQueryAttention path (``--target cpu|cuda``, see :func:`attention_paths`): the same
q/k norms and the same in-graph RoPE are applied to 3-D ``[B, S, heads·hd]`` q/k *before*
``com.microsoft.GroupQueryAttention`` (``do_rotary = 0``), so each layer type keeps its own
(default or proportional) rotation without ``[max_pos, hd/2]`` tables. Causality comes from
``seqlens_k`` / ``total_sequence_length`` (right padding only); sliding layers set
``local_window_size = W`` (onnxruntime counts the current token, as HF's ``sliding_window``
does). A KV consumer passes empty ``[B, 0, kvh·hd]`` K/V with the producer's present as past,
so GQA attends exactly the producer's post-update cache and its own present is discarded.
"""

from __future__ import annotations

import logging

import onnx_ir as ir
from onnxscript import nn

from mobius.components import (
    GroupQueryAttention,
    Linear,
    RMSNorm,
    apply_rotary,
    gqa_available,
)
from mobius_gemma4.config import FULL, Gemma4TextConfig

log = logging.getLogger("mobius_gemma4.text")

ATTENTION, GQA = "Attention", "GroupQueryAttention"


def attention_paths(
    cfg: Gemma4TextConfig,
    target: str,
    dtype: ir.DataType,
    overlay: bool = False,
    overlay_full_layers: bool = False,
) -> tuple[str, ...]:
    """Which attention op each layer uses: :data:`ATTENTION` or :data:`GQA`.

    ``target`` ``default`` keeps ``Attention`` everywhere. ``cpu`` / ``cuda`` use
    GroupQueryAttention where it computes exactly what HF does: the target has a kernel
    for the build dtype, and the layer's mask is plain causal (+ window). ``overlay``
    (the multimodal decoder of a ``use_bidirectional_attention = "vision"`` model) puts
    the image-block overlay on sliding layers, which GQA cannot express, so those keep
    ``Attention``; full layers are causal-only in HF even then (docs/gemma4.md §4), except
    with ``overlay_full_layers`` (``gemma4_unified``), where every layer keeps ``Attention``.
    """
    if target == "default":
        return (ATTENTION,) * cfg.num_hidden_layers
    if not gqa_available(target, dtype):
        log.info(
            "target %s, dtype %s: onnxruntime has no GroupQueryAttention kernel for this "
            "dtype; every layer keeps the exact ONNX Attention path",
            target,
            dtype.name.lower(),
        )
        return (ATTENTION,) * cfg.num_hidden_layers
    if overlay and overlay_full_layers:
        return (ATTENTION,) * cfg.num_hidden_layers
    return tuple(ATTENTION if overlay and t != FULL else GQA for t in cfg.layer_types)


def describe_paths(paths: tuple[str, ...]) -> str:
    """``"GroupQueryAttention: layers 0-5; Attention: none"`` for the build log."""
    parts = []
    for kind in (GQA, ATTENTION):
        idx = [str(i) for i, p in enumerate(paths) if p == kind]
        parts.append(f"{kind}: layers {', '.join(idx) if idx else 'none'}")
    return "; ".join(parts)


class Gemma4Attention(nn.Module):
    """One layer's attention. ``forward`` returns ``(out, key, value)`` with key/value = present.

    ``mask`` is the layer type's bool mask ``[B, 1, S, T]`` on the ``Attention`` path and the
    ``(seqlens_k, total_sequence_length)`` pair of :func:`mobius.components.gqa_lengths` on
    the GroupQueryAttention path.
    """

    def __init__(
        self, cfg: Gemma4TextConfig, i: int, dtype: ir.DataType, path: str = ATTENTION
    ) -> None:
        super().__init__()
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        self.hd, self.kvh, self.nh = cfg.head_dims[i], cfg.kv_heads[i], nh
        eps = cfg.rms_norm_eps
        self.dtype = dtype
        self.consumer = cfg.is_kv_consumer(i)
        self.k_eq_v = cfg.uses_k_eq_v(i)
        self.path = path
        self.q_proj = Linear(H, nh * self.hd, dtype=dtype)
        self.q_norm = RMSNorm(self.hd, eps, dtype=dtype)
        if not self.consumer:
            self.k_proj = Linear(H, self.kvh * self.hd, dtype=dtype)
            if not self.k_eq_v:
                self.v_proj = Linear(H, self.kvh * self.hd, dtype=dtype)
            self.k_norm = RMSNorm(self.hd, eps, dtype=dtype)
            self.v_norm = RMSNorm(self.hd, eps, with_weight=False, dtype=dtype)
        self.o_proj = Linear(nh * self.hd, H, dtype=dtype)
        if path == GQA:
            window = cfg.sliding_window if cfg.layer_types[i] != FULL else -1
            self.gqa = GroupQueryAttention(
                nh, self.kvh, self.hd, scale=1.0, local_window_size=window
            )

    def _heads(self, op, x, n):
        # [B, S, n·hd] -> [B, S, n, hd]
        return op.Reshape(x, op.Constant(value_ints=[0, 0, n, self.hd]))

    def _flat(self, op, x):
        # [B, S, n, hd] -> [B, S, n·hd]
        return op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))

    def forward(self, op, x, cos, sin, mask, past=None, shared=None):
        if self.path == GQA:
            return self._forward_gqa(op, x, cos, sin, mask, past, shared)
        to_bnsh = [0, 2, 1, 3]
        q = self.q_norm(op, self._heads(op, self.q_proj(op, x), self.nh))
        q = apply_rotary(op, op.Transpose(q, perm=to_bnsh), cos, sin)
        attrs = {"scale": 1.0}
        if self.dtype != ir.DataType.FLOAT:
            attrs["softmax_precision"] = 1
        if self.consumer:
            key, value = shared
            y = op.Attention(q, key, value, mask, **attrs)
            present_k, present_v = key, value
        else:
            k_raw = self._heads(op, self.k_proj(op, x), self.kvh)
            v_raw = k_raw if self.k_eq_v else self._heads(op, self.v_proj(op, x), self.kvh)
            k = apply_rotary(op, op.Transpose(self.k_norm(op, k_raw), perm=to_bnsh), cos, sin)
            v = op.Transpose(self.v_norm(op, v_raw), perm=to_bnsh)
            past_k, past_v = past
            y, present_k, present_v = op.Attention(
                q, k, v, mask, past_k, past_v, _outputs=3, **attrs
            )
        y = op.Reshape(op.Transpose(y, perm=to_bnsh), op.Constant(value_ints=[0, 0, -1]))
        return self.o_proj(op, y), present_k, present_v

    def _forward_gqa(self, op, x, cos, sin, lengths, past, shared):
        seqlens_k, total = lengths
        q = self._flat(op, self.q_norm(op, self._heads(op, self.q_proj(op, x), self.nh)))
        q = apply_rotary(op, q, cos, sin, num_heads=self.nh)
        if self.consumer:
            # empty [B, 0, kvh·hd] K/V: GQA appends nothing to the producer's cache
            empty = op.Slice(q, [0, 0], [0, self.kvh * self.hd], [1, 2])
            past_k, past_v = shared
            y, _, _ = self.gqa(op, q, empty, empty, past_k, past_v, seqlens_k, total)
            return self.o_proj(op, y), past_k, past_v
        k_raw = self._heads(op, self.k_proj(op, x), self.kvh)
        v_raw = k_raw if self.k_eq_v else self._heads(op, self.v_proj(op, x), self.kvh)
        k = apply_rotary(op, self._flat(op, self.k_norm(op, k_raw)), cos, sin, num_heads=self.kvh)
        v = self._flat(op, self.v_norm(op, v_raw))
        past_k, past_v = past
        y, present_k, present_v = self.gqa(op, q, k, v, past_k, past_v, seqlens_k, total)
        return self.o_proj(op, y), present_k, present_v
