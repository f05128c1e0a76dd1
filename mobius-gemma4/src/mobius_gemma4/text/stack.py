"""The layer stack shared by the ``decoder`` and single ``model`` graphs.

Builds the masks and per-type cos/sin once, runs every layer, wires KV sharing (a consumer
reads the post-update K/V of the last cache-owning layer of its type) and applies the final
norm. Past K/V of cache-owning layer ``i`` come in as ``past[i]``; presents go out as
``present[i]``.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_gemma4.config import FULL, Gemma4TextConfig
from mobius_gemma4.text.decoder_layer import Gemma4DecoderLayer
from mobius_gemma4.text.masks import build_masks
from mobius_gemma4.text.primitives import RMSNorm
from mobius_gemma4.text.rope import cos_sin


class Gemma4TextStack(nn.Module):
    """``layers.*`` + ``norm`` under their HF names (prefix-free, like the initializers)."""

    def __init__(self, cfg: Gemma4TextConfig, dtype: ir.DataType) -> None:
        super().__init__("")
        self.cfg, self.dtype = cfg, dtype
        self.layers = nn.ModuleList(
            [Gemma4DecoderLayer(cfg, i, dtype) for i in range(cfg.num_hidden_layers)]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)

    def forward(self, op, h, attention_mask, position_ids, past, ple_flat=None):
        cfg = self.cfg
        seq_len = op.Shape(h, start=1, end=2)
        full_mask, sliding_mask = build_masks(op, attention_mask, seq_len, cfg.sliding_window)
        rope = {
            t: cos_sin(op, cfg, t, position_ids, self.dtype) for t in sorted(set(cfg.layer_types))
        }
        present: dict[int, tuple[ir.Value, ir.Value]] = {}
        for i, layer in enumerate(self.layers):
            t = cfg.layer_types[i]
            cos, sin = rope[t]
            mask = full_mask if t == FULL else sliding_mask
            if cfg.is_kv_consumer(i):
                shared = present[cfg.kv_producer(i)]
                h, _, _ = layer(op, h, cos, sin, mask, ple_flat, None, shared)
            else:
                h, k, v = layer(op, h, cos, sin, mask, ple_flat, past[i], None)
                present[i] = (k, v)
        return self.norm(op, h), present


def softcap(op, logits, cap: float | None):
    """``cap · tanh(logits / cap)`` as HF does, or the logits unchanged when cap is None."""
    if cap is None:
        return logits
    return op.Mul(op.Tanh(op.Div(logits, cap)), cap)
