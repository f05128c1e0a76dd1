"""Weight plan of the ``vision_encoder`` graph (docs/gemma4.md §11).

Initializer names are the checkpoint names with the ``model.`` wrapper prefix and
the ClippableLinear ``.linear`` level removed (``vision_tower.encoder.layers.0.
self_attn.q_proj.weight``); linear weights are transposed to ``[in, out]``; every
float tensor is cast to the build dtype at save time.
"""

from __future__ import annotations

from typing import Any

from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE, BuildOptions
from mobius.weights import WeightPlan, ref
from mobius_gemma4.vision.config import Gemma4VisionConfig
from mobius_gemma4.weights.entries import CKPT_PREFIX, plan_from_entries

"""Prefix of the multimodal checkpoint (``Gemma4ForConditionalGeneration``)."""

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_BOUNDS = ("input_min", "input_max", "output_min", "output_max")
_LAYER_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


def vision_weight_entries(cfg: Gemma4VisionConfig) -> list[tuple[str, str, bool]]:
    """``(initializer, checkpoint tensor, transpose)`` for every vision initializer.

    The plain-data form of the plan; :func:`vision_weight_plan` wraps it in lazy
    expressions. Checkpoint names carry the ``model.`` prefix.
    """
    t = "vision_tower."
    out: list[tuple[str, str, bool]] = [
        (f"{t}patch_embedder.input_proj.weight", f"{t}patch_embedder.input_proj.weight", True),
        (
            f"{t}patch_embedder.position_embedding_table",
            f"{t}patch_embedder.position_embedding_table",
            False,
        ),
    ]
    for i in range(cfg.num_hidden_layers):
        lp = f"{t}encoder.layers.{i}."
        linears = [f"self_attn.{m}" for m in _ATTN] + [f"mlp.{m}" for m in _MLP]
        for m in linears:
            out.append((f"{lp}{m}.weight", f"{lp}{m}.linear.weight", True))
            if cfg.use_clipped_linears:
                out += [(f"{lp}{m}.{b}", f"{lp}{m}.{b}", False) for b in _BOUNDS]
        out += [(f"{lp}{n}.weight", f"{lp}{n}.weight", False) for n in _LAYER_NORMS]
        out += [
            (f"{lp}self_attn.{n}.weight", f"{lp}self_attn.{n}.weight", False)
            for n in ("q_norm", "k_norm")
        ]
    if cfg.standardize:
        out += [(f"{t}std_bias", f"{t}std_bias", False), (f"{t}std_scale", f"{t}std_scale", False)]
    e = "embed_vision.embedding_projection.weight"
    out.append((e, e, True))
    return out


PATCH = "vision_tower.patch_embedder.input_proj.weight"


def vision_weight_plan(
    cfg: Gemma4VisionConfig, options: BuildOptions, checkpoint: Any = None
) -> WeightPlan:
    """Plan for ``model.vision_tower.*`` + ``model.embed_vision.*`` of a multimodal checkpoint.

    Without ``use_clipped_linears`` the graph has no bound initializers; bounds that a
    checkpoint nevertheless carries are ignored (reported), not an error. The patch
    embedding is HF's ``[hidden, p·p·3]`` (channels last), or llama.cpp's conv kernel
    ``[hidden, 3, p, p]`` (an mmproj GGUF file: :mod:`mobius_gemma4.gguf_mmproj`),
    permuted back here.
    """
    entries = vision_weight_entries(cfg)
    info = None if checkpoint is None else checkpoint.tensors.get(CKPT_PREFIX + PATCH)
    if info is not None and len(info.shape) == 4:
        entries = [e for e in entries if e[0] != PATCH]
    plan = plan_from_entries(entries, options)
    if info is not None and len(info.shape) == 4:
        hidden = info.shape[0]
        expr = ref(CKPT_PREFIX + PATCH).transpose((0, 2, 3, 1)).reshape((hidden, -1))
        plan.add(PATCH, expr.transpose().cast(PORT_DTYPE_OF_BUILD_DTYPE[options.dtype]))
    if not cfg.use_clipped_linears:
        for i in range(cfg.num_hidden_layers):
            lp = f"{CKPT_PREFIX}vision_tower.encoder.layers.{i}."
            for m in [f"self_attn.{m}" for m in _ATTN] + [f"mlp.{m}" for m in _MLP]:
                for b in _BOUNDS:
                    plan.ignore(f"{lp}{m}.{b}", "use_clipped_linears is false")
    return plan
