"""Seeded tiny random Qwen3 checkpoints written by HF transformers 5.24 (torch, CPU).

:func:`mobius_testing.lm_parity.make_checkpoint` writes each model twice (``saved/``:
``save_pretrained``'s shape with ``rope_parameters``, ``num_local_experts`` and
per-expert MoE tensors; ``hub/``: the Hub's config shape). Two Qwen3 specifics:

- for the MoE spec, ``hub/`` holds HF's fused expert tensors (``mlp.experts.gate_up_proj``
  / ``down_proj``) so the second accepted layout is exercised too;
- MoE router weights are scaled by ``ROUTER_SCALE``: a random router at init is nearly
  uniform over the experts (top-k margins ~1e-4, inside float16 noise), a trained one is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mobius_testing.lm_parity import CheckpointPair
from mobius_testing.lm_parity import make_checkpoint as make_pair

ROUTER_SCALE = 4.0


def _sharpen_routers(model) -> None:
    for name, p in model.named_parameters():
        if name.endswith("mlp.gate.weight"):
            p.mul_(ROUTER_SCALE)


def _fuse_experts(tensors: dict[str, Any]) -> dict[str, Any]:
    """Per-expert ``experts.{e}.*_proj.weight`` → HF's fused ``gate_up_proj`` / ``down_proj``."""
    import re

    import torch

    out, groups = {}, {}
    for name, t in tensors.items():
        m = re.match(r"(.*\.mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$", name)
        if m is None:
            out[name] = t
            continue
        groups.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
    for base, experts in groups.items():
        order = sorted(experts)
        out[base + "gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate"], experts[e]["up"]], dim=0) for e in order]
        ).contiguous()
        out[base + "down_proj"] = torch.stack([experts[e]["down"] for e in order]).contiguous()
    return out


def make_checkpoint(name: str, raw: dict[str, Any], root: Path, seed: int = 0) -> CheckpointPair:
    moe = raw["model_type"] == "qwen3_moe"
    return make_pair(
        name,
        raw,
        root,
        seed,
        adjust=_sharpen_routers,
        hub_tensors=_fuse_experts if moe else None,
    )
