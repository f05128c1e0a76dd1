"""Seeded tiny HF vision/audio towers and a checkpoint folder holding their weights.

Every tensor HF initialises to a constant (norm weights, position table,
per_dim_scale, std_bias/std_scale, ±inf clip bounds) is perturbed so that a
graph that drops one shows up as a difference; clip bounds are set so they bite
(inputs ±U(1.5, 2.5), outputs ±U(0.1, 0.3), docs/gemma4.md §13). Only called from
tests marked ``reference``: it imports torch and transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from reference.paths import TINY_HUBSTYLE

TINY = TINY_HUBSTYLE


def tiny_raw(**overrides: Any) -> dict:
    """The tiny hub-style config, with ``vision_config``/``audio_config`` keys overridden."""
    raw = json.loads(TINY.read_text())
    for section, values in overrides.items():
        raw[section] = {**raw[section], **values}
    return raw


def _perturb(module: Any, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point() or name.endswith("inv_freq") or "inv_timescales" in name:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("input_min", "output_min", "input_max", "output_max"):
                lo, hi = (1.5, 2.5) if leaf.startswith("input") else (0.1, 0.3)
                v = lo + (hi - lo) * torch.rand((), generator=g)
                t.copy_(-v if leaf.endswith("min") else v)
            elif leaf == "softcap":
                continue
            elif leaf == "std_scale":
                t.copy_(1.0 + 0.2 * torch.randn(t.shape, generator=g))
            else:
                t.add_(0.1 * torch.randn(t.shape, generator=g))


def hf_vision(raw: dict, seed: int = 0) -> tuple[Any, Any]:
    """``(Gemma4VisionModel, embed_vision)`` of ``raw`` in f32 eval mode, perturbed."""
    import torch
    from transformers.models.gemma4 import modeling_gemma4 as m
    from transformers.models.gemma4.configuration_gemma4 import Gemma4Config

    cfg = Gemma4Config.from_dict(raw)
    vc = cfg.vision_config
    vc._attn_implementation = "eager"
    torch.manual_seed(seed)
    tower = m.Gemma4VisionModel(vc).eval()
    embed = m.Gemma4MultimodalEmbedder(vc, cfg.text_config).eval()
    _perturb(tower, seed + 1)
    _perturb(embed, seed + 2)
    return tower, embed


def hf_audio(raw: dict, seed: int = 0) -> tuple[Any, Any]:
    """``(Gemma4AudioModel, embed_audio)`` of ``raw`` in f32 eval mode, perturbed."""
    import torch
    from transformers.models.gemma4 import modeling_gemma4 as m
    from transformers.models.gemma4.configuration_gemma4 import Gemma4Config

    cfg = Gemma4Config.from_dict(raw)
    ac = cfg.audio_config
    ac._attn_implementation = "eager"
    torch.manual_seed(seed)
    tower = m.Gemma4AudioModel(ac).eval()
    embed = m.Gemma4MultimodalEmbedder(ac, cfg.text_config).eval()
    _perturb(tower, seed + 1)
    _perturb(embed, seed + 2)
    return tower, embed


def write_checkpoint(folder: Path, raw: dict, modules: dict[str, Any]) -> Path:
    """Write ``config.json`` + ``model.safetensors`` with ``model.<prefix>.<name>`` tensors.

    ``modules`` maps a checkpoint prefix (``vision_tower``, ``embed_vision`` …) to a
    torch module whose persistent state dict is stored under it.
    """
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for prefix, module in modules.items():
        for name, t in module.state_dict().items():
            tensors[f"model.{prefix}.{name}"] = np.array(
                t.detach().cpu().numpy(), order="C"
            )  # keeps 0-d
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(raw))
    return folder
