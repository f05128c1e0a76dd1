"""Seeded tiny random Qwen3 checkpoints written by HF transformers 5.24 (torch, CPU).

``make_checkpoint`` writes one model twice, with the same weights:

- ``saved/``: exactly what ``save_pretrained`` writes (``rope_parameters``,
  ``num_local_experts``, per-expert MoE tensors);
- ``hub/``: the Hub's config shape (top-level ``rope_theta`` + ``rope_scaling``,
  ``num_experts``). For the MoE spec its safetensors hold HF's fused expert tensors
  (``mlp.experts.gate_up_proj`` / ``down_proj``) so the second accepted layout is
  exercised too.

Every constant-initialised parameter (the RMSNorm weights) is perturbed, so a builder
that drops or misplaces one shows up as a logit difference. MoE router weights are
scaled by ``ROUTER_SCALE``: a random router at init is nearly uniform over the experts
(top-k margins ~1e-4, inside float16 noise), a trained one is not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROUTER_SCALE = 4.0


@dataclass(frozen=True)
class CheckpointPair:
    name: str
    model_type: str
    saved: Path
    hub: Path


def model_class(model_type: str) -> Any:
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM if model_type == "qwen3_moe" else Qwen3ForCausalLM


def hf_config(raw: dict[str, Any]) -> Any:
    from transformers import Qwen3Config, Qwen3MoeConfig

    cls = Qwen3MoeConfig if raw["model_type"] == "qwen3_moe" else Qwen3Config
    return cls(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures")})


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
    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    model = model_class(raw["model_type"])(hf_config(raw)).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            if flat.numel() and bool((flat == flat[0]).all()):
                p.add_(torch.randn(p.shape, generator=generator) * 0.1)
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.mul_(ROUTER_SCALE)
    saved, hub = root / "saved", root / "hub"
    model.save_pretrained(saved)
    hub.mkdir(parents=True, exist_ok=True)
    tensors = load_file(saved / "model.safetensors")
    if raw["model_type"] == "qwen3_moe":
        tensors = _fuse_experts(tensors)
    save_file(tensors, hub / "model.safetensors", metadata={"format": "pt"})
    (hub / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    return CheckpointPair(name, raw["model_type"], saved, hub)
