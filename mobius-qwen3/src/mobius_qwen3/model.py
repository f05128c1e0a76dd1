"""The ``model`` graph of Qwen3 / Qwen3-MoE: core's Llama-shaped decoder with q/k norms.

HF 5.24 ``Qwen3DecoderLayer`` is :class:`mobius.lm.decoder.DecoderLM`'s layer with
``q_norm`` / ``k_norm`` (RMSNorm over each head's ``head_dim``, before RoPE); the sparse
layers of qwen3_moe hold routed experts (:class:`mobius_qwen3.moe.Qwen3SparseMoe`) in
place of the gated MLP. Attention path, masks, rope, head: see :mod:`mobius.lm.decoder`.
"""

from __future__ import annotations

import onnx_ir as ir

from mobius.lm.decoder import build_decoder, gated_mlp
from mobius_qwen3.config import Qwen3Config
from mobius_qwen3.moe import Qwen3SparseMoe


def _mlp(cfg: Qwen3Config, i: int, dtype: ir.DataType):
    return Qwen3SparseMoe(cfg, dtype) if cfg.sparse_layers[i] else gated_mlp(cfg, i, dtype)


def build_model(cfg: Qwen3Config, build_dtype: str, target: str = "default", **kw) -> ir.Model:
    """The ``model`` graph of :func:`mobius.lm.ports.lm_contract` (``kw``: e.g. ``logits=``,
    passed to :func:`mobius.lm.decoder.build_decoder`)."""
    return build_decoder(cfg, build_dtype, target, family="qwen3", qk_norm=True, mlp=_mlp, **kw)
