"""Attention cores: the standard ONNX ``Attention`` op and onnxruntime's ``GroupQueryAttention``.

Both take projected (and, for ``Attention``, already rotated) 3-D Q/K/V
``[B, S, heads·head_dim]`` and keep the KV cache in 4-D BNSH ``[B, kv_heads, T, head_dim]``.
Projections, q/k norms and rotary stay in the family's layer code; these modules are
only the part an execution provider may fuse.
"""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype
from mobius.components.graph import ms_opset

_F32, _F16, _BF16 = ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16
GQA_DTYPES: dict[str, tuple[ir.DataType, ...]] = {"cpu": (_F32, _F16), "cuda": (_F16, _BF16)}
"""Build dtypes onnxruntime 1.31 has a GroupQueryAttention kernel for, per build target
(CPU: float/float16, no bfloat16 kernel, measured; CUDA: float16/bfloat16)."""


def gqa_available(target: str, dtype: str | ir.DataType) -> bool:
    """True when a ``--target`` build in ``dtype`` may use :class:`GroupQueryAttention`.

    ``default`` never does (it is the portable ONNX ``Attention`` graph); ``cpu`` and
    ``cuda`` do for the dtypes of :data:`GQA_DTYPES`. Whether a layer's mask is one
    GroupQueryAttention expresses exactly (causal, optionally windowed, right padding)
    is the family's decision on top of this.
    """
    return ir_dtype(dtype) in GQA_DTYPES.get(target, ())


def _dim(value: ir.Value, axis: int) -> int | str | None:
    shape = value.shape
    if shape is None or len(shape) <= axis:
        return None
    dim = shape[axis]
    return dim if isinstance(dim, int) else dim.value


class _AttentionCore(nn.Module):
    """What both attention ops share: head geometry, scale, logit soft-cap, output shapes."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float | None,
        softcap: float,
        name: str | None,
    ) -> None:
        super().__init__(name)
        self.num_heads = int(num_heads)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        self.scale = float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)
        self.softcap = float(softcap)

    def _shaped(
        self, q: ir.Value, out: ir.Value, present_key: ir.Value, present_value: ir.Value
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        """The op's outputs, with the shapes inference left blank filled in (graph outputs
        need one): ``out`` ``[B, S, num_heads·head_dim]``, presents ``[B, kv, T, head_dim]``."""
        batch, steps = _dim(q, 0), _dim(q, 1)
        if out.shape is None:
            out.shape = ir.Shape([batch, steps, self.num_heads * self.head_dim])
        for value in (present_key, present_value):
            if value.shape is None:
                value.shape = ir.Shape([batch, self.num_kv_heads, None, self.head_dim])
        return out, present_key, present_value


class Attention(_AttentionCore):
    """Scaled dot-product attention on the ONNX ``Attention`` op (opset 23).

    Constructor: ``Attention(num_heads, num_kv_heads, head_dim, *, scale=None, softcap=0.0,
    is_causal=False, softmax_float32=False, name=None)``; ``scale`` defaults to
    ``1/sqrt(head_dim)``; ``softcap > 0`` caps the logits (``softcap·tanh(s/softcap)``)
    before the mask is added; ``softmax_float32`` sets ``softmax_precision`` to float32
    (HF computes the softmax in float32 for half-precision models).

    ``forward(op, q, k, v, mask=None, past_key=None, past_value=None)
    -> (out, present_key, present_value)``:

    - ``q`` ``[B, S, num_heads·head_dim]``, ``k``/``v`` ``[B, S, num_kv_heads·head_dim]``
    - ``mask``: additive float mask (dtype of q) broadcastable to ``[B, num_heads, S, T]``
      with ``T = past + S`` (0 keep, large negative drop), e.g. from
      :func:`mobius.components.masks.additive_attention_mask`; or a bool mask (True keep).
    - ``past_key``/``past_value`` ``[B, num_kv_heads, past, head_dim]`` (give both or neither)
    - ``out`` ``[B, S, num_heads·head_dim]``; ``present_*`` ``[B, num_kv_heads, T, head_dim]``
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        scale: float | None = None,
        softcap: float = 0.0,
        is_causal: bool = False,
        softmax_float32: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale, softcap, name)
        self.is_causal = bool(is_causal)
        self.softmax_float32 = bool(softmax_float32)

    def forward(
        self,
        op: OpBuilder,
        q: ir.Value,
        k: ir.Value,
        v: ir.Value,
        mask: ir.Value | None = None,
        past_key: ir.Value | None = None,
        past_value: ir.Value | None = None,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        if (past_key is None) != (past_value is None):
            raise ValueError("Attention: give both past_key and past_value, or neither")
        attrs: dict[str, object] = {
            "q_num_heads": self.num_heads,
            "kv_num_heads": self.num_kv_heads,
            "scale": self.scale,
        }
        if self.softcap > 0:
            attrs["softcap"] = self.softcap
        if self.is_causal:
            attrs["is_causal"] = 1
        if self.softmax_float32:
            attrs["softmax_precision"] = 1  # TensorProto.FLOAT
        out, present_key, present_value = op.Attention(
            q, k, v, mask, past_key, past_value, **attrs, _outputs=3
        )
        return self._shaped(q, out, present_key, present_value)


class GroupQueryAttention(_AttentionCore):
    """onnxruntime's fused ``com.microsoft.GroupQueryAttention`` (causal, optional rotary).

    Constructor: ``GroupQueryAttention(num_heads, num_kv_heads, head_dim, *, scale=None,
    softcap=0.0, local_window_size=-1, rotary_interleaved=False, name=None)``.
    ``local_window_size`` W: a query sees the last W keys, itself included — the same
    number as HF's ``sliding_window`` (verified against onnxruntime 1.31 CPU); ``-1`` means
    full causal. onnxruntime's CPU kernel with ``do_rotary`` needs ``head_dim % 16 == 0``.

    ``forward(op, q, k, v, past_key, past_value, seqlens_k, total_sequence_length,
    cos_cache=None, sin_cache=None) -> (out, present_key, present_value)``:

    - ``q`` ``[B, S, num_heads·head_dim]``, ``k``/``v`` ``[B, S, num_kv_heads·head_dim]``
      (not rotated: with ``cos_cache``/``sin_cache`` the op rotates q and k itself,
      positions ``past .. past+S-1`` taken from ``seqlens_k``)
    - ``past_key``/``past_value`` ``[B, num_kv_heads, past, head_dim]`` (may have ``past = 0``)
    - ``seqlens_k`` int32 ``[B]``: total valid length − 1 per row; ``total_sequence_length``
      int32 scalar (see :func:`mobius.components.masks.gqa_lengths`)
    - ``cos_cache``/``sin_cache`` ``[max_positions, head_dim/2]`` in q's dtype
      (:meth:`RotaryEmbedding.tables`), split-half layout unless ``rotary_interleaved``.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        scale: float | None = None,
        softcap: float = 0.0,
        local_window_size: int = -1,
        rotary_interleaved: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale, softcap, name)
        self.local_window_size = int(local_window_size)
        self.rotary_interleaved = bool(rotary_interleaved)

    def forward(
        self,
        op: OpBuilder,
        q: ir.Value,
        k: ir.Value,
        v: ir.Value,
        past_key: ir.Value,
        past_value: ir.Value,
        seqlens_k: ir.Value,
        total_sequence_length: ir.Value,
        cos_cache: ir.Value | None = None,
        sin_cache: ir.Value | None = None,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        if (cos_cache is None) != (sin_cache is None):
            raise ValueError("GroupQueryAttention: give both cos_cache and sin_cache, or neither")
        ms = ms_opset(op)
        inputs = [q, k, v, past_key, past_value, seqlens_k, total_sequence_length]
        attrs: dict[str, object] = {
            "num_heads": self.num_heads,
            "kv_num_heads": self.num_kv_heads,
            "scale": self.scale,
            "local_window_size": self.local_window_size,
        }
        if cos_cache is not None:
            inputs += [cos_cache, sin_cache]
            attrs["do_rotary"] = 1
            attrs["rotary_interleaved"] = int(self.rotary_interleaved)
        if self.softcap > 0:
            attrs["softcap"] = self.softcap
        out, present_key, present_value = ms.GroupQueryAttention(*inputs, **attrs, _outputs=3)
        for value in (out, present_key, present_value):
            value.type = q.type
        return self._shaped(q, out, present_key, present_value)
