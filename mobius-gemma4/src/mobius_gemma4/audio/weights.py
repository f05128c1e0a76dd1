"""Weight plan of the ``audio_encoder`` graph (docs/gemma4.md §11).

Initializer names are the checkpoint names without ``model.`` and without the
ClippableLinear ``.linear`` level; linear weights are transposed to ``[in, out]``,
conv kernels stay as stored (ONNX Conv uses PyTorch's ``[out, in/groups, k…]``).
"""

from __future__ import annotations

from mobius.records import BuildOptions
from mobius.weights import WeightPlan
from mobius_gemma4.audio.config import Gemma4AudioConfig
from mobius_gemma4.weights.entries import plan_from_entries

_BOUNDS = ("input_min", "input_max", "output_min", "output_max")


def _clippable(cfg: Gemma4AudioConfig, name: str) -> list[tuple[str, str, bool]]:
    out = [(f"{name}.weight", f"{name}.linear.weight", True)]
    if cfg.use_clipped_linears:
        out += [(f"{name}.{b}", f"{name}.{b}", False) for b in _BOUNDS]
    return out


def _same(name: str, transpose: bool = False) -> tuple[str, str, bool]:
    return (name, name, transpose)


def audio_weight_entries(cfg: Gemma4AudioConfig) -> list[tuple[str, str, bool]]:
    """``(initializer, checkpoint tensor without 'model.', transpose)`` for every audio initializer."""
    t = "audio_tower."
    s = f"{t}subsample_conv_projection."
    out = [
        _same(f"{s}layer0.conv.weight"),
        _same(f"{s}layer0.norm.weight"),
        _same(f"{s}layer1.conv.weight"),
        _same(f"{s}layer1.norm.weight"),
        _same(f"{s}input_proj_linear.weight", True),
    ]
    for i in range(cfg.num_hidden_layers):
        lp = f"{t}layers.{i}."
        for ff in ("feed_forward1", "feed_forward2"):
            out += _clippable(cfg, f"{lp}{ff}.ffw_layer_1") + _clippable(
                cfg, f"{lp}{ff}.ffw_layer_2"
            )
            out += [
                _same(f"{lp}{ff}.pre_layer_norm.weight"),
                _same(f"{lp}{ff}.post_layer_norm.weight"),
            ]
        for m in ("q_proj", "k_proj", "v_proj", "post"):
            out += _clippable(cfg, f"{lp}self_attn.{m}")
        out += [
            _same(f"{lp}self_attn.relative_k_proj.weight", True),
            _same(f"{lp}self_attn.per_dim_scale"),
        ]
        out += _clippable(cfg, f"{lp}lconv1d.linear_start") + _clippable(
            cfg, f"{lp}lconv1d.linear_end"
        )
        out += [
            _same(f"{lp}lconv1d.depthwise_conv1d.weight"),
            _same(f"{lp}lconv1d.pre_layer_norm.weight"),
            _same(f"{lp}lconv1d.conv_norm.weight"),
        ]
        out += [_same(f"{lp}{n}.weight") for n in ("norm_pre_attn", "norm_post_attn", "norm_out")]
    out += [_same(f"{t}output_proj.weight", True), _same(f"{t}output_proj.bias")]
    out.append(_same("embed_audio.embedding_projection.weight", True))
    return out


def audio_weight_plan(cfg: Gemma4AudioConfig, options: BuildOptions) -> WeightPlan:
    """Plan for ``model.audio_tower.*`` + ``model.embed_audio.*`` of a multimodal checkpoint."""
    return plan_from_entries(audio_weight_entries(cfg), options)
