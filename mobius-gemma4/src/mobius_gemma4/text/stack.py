"""The layer stack shared by the ``decoder`` and single ``model`` graphs.

Builds the masks (or, for GroupQueryAttention layers, ``seqlens_k`` /
``total_sequence_length``) and per-type cos/sin once, runs every layer, wires KV sharing (a
consumer reads the post-update K/V of the last cache-owning layer of its type) and applies
the final norm. Past K/V of cache-owning layer ``i`` come in as ``past[i]``; presents go out
as ``present[i]`` — BNSH ``[B, kvh, T, hd]`` on both attention paths, so the ports do not
depend on the target. Which layer uses which op is decided by
:func:`mobius_gemma4.text.attention.attention_paths` and logged.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius.components import RMSNorm, gqa_lengths
from mobius.errors import BuildError
from mobius_gemma4.config import FULL, Gemma4TextConfig
from mobius_gemma4.text.attention import ATTENTION, GQA, attention_paths, describe_paths, log
from mobius_gemma4.text.decoder_layer import Gemma4DecoderLayer
from mobius_gemma4.text.masks import build_masks
from mobius_gemma4.text.rope import cos_sin


class Gemma4TextStack(nn.Module):
    """``layers.*`` + ``norm`` under their HF names (prefix-free, like the initializers).

    ``target`` is the build target (``default`` / ``cpu`` / ``cuda``); ``overlay`` is true
    for a decoder that applies the ``"vision"`` image-block mask overlay on sliding layers.
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
        log.info("target %s: %s", target, describe_paths(self.paths))
        self.layers = nn.ModuleList(
            [Gemma4DecoderLayer(cfg, i, dtype, self.paths[i]) for i in range(cfg.num_hidden_layers)]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)

    def forward(self, op, h, attention_mask, position_ids, past, ple_flat=None, image_blocks=None):
        cfg = self.cfg
        if image_blocks is not None and any(
            p == GQA and (t != FULL or self.overlay_full_layers)
            for p, t in zip(self.paths, cfg.layer_types)
        ):
            raise BuildError(
                "image-block mask overlay requested on a stack whose sliding layers use "
                "GroupQueryAttention",
                where="mobius_gemma4.text.stack.Gemma4TextStack",
                fix="construct the stack with overlay=True so sliding layers keep Attention",
            )
        masks = {}
        if ATTENTION in self.paths:
            full_mask, sliding_mask = build_masks(
                op,
                attention_mask,
                h,
                cfg.sliding_window,
                image_blocks,
                overlay_full_layers=self.overlay_full_layers,
            )
            masks = {FULL: full_mask, "sliding": sliding_mask}
        lengths = gqa_lengths(op, attention_mask) if GQA in self.paths else None
        rope = {
            t: cos_sin(op, cfg, t, position_ids, self.dtype) for t in sorted(set(cfg.layer_types))
        }
        present: dict[int, tuple[ir.Value, ir.Value]] = {}
        for i, layer in enumerate(self.layers):
            t = cfg.layer_types[i]
            cos, sin = rope[t]
            if self.paths[i] == GQA:
                mask = lengths
            else:
                mask = masks[FULL] if t == FULL else masks["sliding"]
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
