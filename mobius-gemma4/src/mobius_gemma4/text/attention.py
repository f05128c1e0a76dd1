"""Gemma 4 self-attention on the ONNX ``Attention`` op (reference §3.2, §9).

Per layer: q = RoPE(q_norm(q_proj(x))); cache owners add k = RoPE(k_norm(k_proj(x))) and
v = v_norm(v_proj(x)) — or, on full layers of k_eq_v models, v = v_norm(raw k projection)
(taken before k_norm and RoPE). ``Attention`` appends them to the past and returns the
present. KV consumers take the producer's present K/V as plain K/V (no past, no cache
write) with their own mask. Scale is 1.0 (q/k norms replace 1/sqrt(hd)); the softmax runs
in float32 (``softmax_precision``) for half-precision builds.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_gemma4.config import Gemma4TextConfig
from mobius_gemma4.text.primitives import Linear, RMSNorm, rms_norm_f32


class Gemma4Attention(nn.Module):
    """One layer's attention. ``forward`` returns ``(out, key, value)`` with key/value = present."""

    def __init__(self, cfg: Gemma4TextConfig, i: int, dtype: ir.DataType) -> None:
        super().__init__()
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        self.hd, self.kvh, self.nh = cfg.head_dims[i], cfg.kv_heads[i], nh
        self.eps = cfg.rms_norm_eps
        self.dtype = dtype
        self.consumer = cfg.is_kv_consumer(i)
        self.k_eq_v = cfg.uses_k_eq_v(i)
        self.q_proj = Linear(H, nh * self.hd, dtype)
        self.q_norm = RMSNorm(self.hd, self.eps, dtype)
        if not self.consumer:
            self.k_proj = Linear(H, self.kvh * self.hd, dtype)
            if not self.k_eq_v:
                self.v_proj = Linear(H, self.kvh * self.hd, dtype)
            self.k_norm = RMSNorm(self.hd, self.eps, dtype)
        self.o_proj = Linear(nh * self.hd, H, dtype)

    def _heads(self, op, x, n):
        # [B, S, n·hd] -> [B, S, n, hd]
        return op.Reshape(x, op.Constant(value_ints=[0, 0, n, self.hd]))

    def forward(self, op, x, cos, sin, mask, past=None, shared=None):
        to_bnsh = [0, 2, 1, 3]
        q = self.q_norm(op, self._heads(op, self.q_proj(op, x), self.nh))
        q = op.RotaryEmbedding(op.Transpose(q, perm=to_bnsh), cos, sin)
        softmax_precision = 1 if self.dtype != ir.DataType.FLOAT else None
        attrs = {"scale": 1.0}
        if softmax_precision is not None:
            attrs["softmax_precision"] = softmax_precision
        if self.consumer:
            key, value = shared
            y = op.Attention(q, key, value, mask, **attrs)
            present_k, present_v = key, value
        else:
            k_raw = self._heads(op, self.k_proj(op, x), self.kvh)
            v_raw = k_raw if self.k_eq_v else self._heads(op, self.v_proj(op, x), self.kvh)
            k = op.RotaryEmbedding(op.Transpose(self.k_norm(op, k_raw), perm=to_bnsh), cos, sin)
            v = op.Transpose(rms_norm_f32(op, v_raw, self.eps, None, self.dtype), perm=to_bnsh)
            past_k, past_v = past
            y, present_k, present_v = op.Attention(
                q, k, v, mask, past_k, past_v, _outputs=3, **attrs
            )
        y = op.Reshape(op.Transpose(y, perm=to_bnsh), op.Constant(value_ints=[0, 0, -1]))
        return self.o_proj(op, y), present_k, present_v
