"""Seeded tiny random Gemma 4 checkpoints written by HF transformers (torch, CPU).

``make_checkpoint`` writes one model twice, with the same weights:

- ``saved/``: exactly what ``save_pretrained`` of transformers 5.24 writes
  (``per_layer_config`` in the text config, one ``model.safetensors``);
- ``hub/``: the hub-style ``config.json`` (``global_head_dim`` /
  ``num_global_key_value_heads``, no ``per_layer_config``) and a safetensors file
  that, like the real E2B/E4B checkpoints, also carries ``k_proj`` / ``v_proj`` /
  ``k_norm`` tensors for the KV-consumer layers that the model never uses.

Every tensor that HF initialises to a constant (norm weights, router scale,
per_expert_scale, layer_scalar, …) is perturbed so that a builder that drops one
shows up as a logit difference (docs/gemma4.md §13 "Fixtures").
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference.specs import TextSpec, hub_style_config, text_part


@dataclass(frozen=True)
class CheckpointPair:
    """The two on-disk shapes of one tiny model."""

    spec: TextSpec
    saved: Path  # save_pretrained output (per_layer_config)
    hub: Path  # hub-style config + extra unused KV-consumer tensors
    extra_tensors: tuple[str, ...]  # names only present in ``hub``


def hf_config(spec: TextSpec) -> Any:
    """The transformers config object of ``spec`` (built from the hub-style dict)."""
    from transformers.models.gemma4 import configuration_gemma4 as c

    raw = hub_style_config(spec)
    text = {k: v for k, v in text_part(raw).items() if k != "model_type"}
    if spec.model_type == "gemma4_text":
        return c.Gemma4TextConfig(**text)
    extra = {k: v for k, v in raw.items() if k.endswith(("_token_id", "_token_index"))}
    vision = raw.get("vision_config")
    audio = raw.get("audio_config")
    return c.Gemma4Config(
        text_config=c.Gemma4TextConfig(**text),
        vision_config=(
            c.Gemma4VisionConfig(**{k: v for k, v in vision.items() if k != "model_type"})
            if vision
            else None
        ),
        audio_config=(
            c.Gemma4AudioConfig(**{k: v for k, v in audio.items() if k != "model_type"})
            if audio
            else None
        ),
        initializer_range=raw["initializer_range"],
        **extra,
    )


def model_class(model_type: str) -> Any:
    """The HF class a checkpoint of ``model_type`` loads into."""
    from transformers.models.gemma4 import modeling_gemma4 as m

    return m.Gemma4ForCausalLM if model_type == "gemma4_text" else m.Gemma4ForConditionalGeneration


def perturb_constants(model: Any, generator: Any) -> list[str]:
    """Give every constant-initialised parameter (and ``layer_scalar``) random values.

    Returns the names changed. Clip bounds of the towers' clippable linears (±inf at
    init) get finite values that bite: inputs ±U(1.5, 2.5), outputs ±U(0.1, 0.3)
    (docs/gemma4.md §13); text logits do not depend on them.
    """
    import torch

    changed: list[str] = []
    with torch.no_grad():
        for name, b in [*model.named_parameters(), *model.named_buffers()]:
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("input_min", "input_max", "output_min", "output_max"):
                lo, hi = (1.5, 2.5) if leaf.startswith("input") else (0.1, 0.3)
                v = lo + (hi - lo) * torch.rand((), generator=generator)
                b.fill_(float(-v if leaf.endswith("min") else v))
                changed.append(name)
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            if flat.numel() == 0 or not torch.isfinite(flat).all():
                continue
            if bool((flat == flat[0]).all()):
                noise = torch.randn(p.shape, generator=generator) * 0.1
                p.add_(noise.to(p.dtype))
                changed.append(name)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=generator))
                changed.append(name)
    return changed


def _text_prefix(model_type: str) -> str:
    return "model.language_model." if model_type == "gemma4" else "model."


def _consumer_extras(spec: TextSpec, generator: Any) -> dict[str, Any]:
    """Unused k/v tensors for KV-consumer layers, as real E2B/E4B checkpoints carry."""
    import torch

    text = spec.text_config()
    n_layers = text["num_hidden_layers"]
    first = n_layers - text.get("num_kv_shared_layers", 0)
    prefix = _text_prefix(spec.model_type)
    extras: dict[str, Any] = {}
    for i in range(first, n_layers):
        full = text["layer_types"][i] == "full_attention"
        hd = text["global_head_dim"] if full else text["head_dim"]
        kvh = text["num_key_value_heads"]
        if full and text.get("attention_k_eq_v") and text.get("num_global_key_value_heads"):
            kvh = text["num_global_key_value_heads"]
        base = f"{prefix}layers.{i}.self_attn."
        shape = (kvh * hd, text["hidden_size"])
        extras[base + "k_proj.weight"] = torch.randn(shape, generator=generator) * 0.05
        extras[base + "v_proj.weight"] = torch.randn(shape, generator=generator) * 0.05
        extras[base + "k_norm.weight"] = 1 + torch.randn((hd,), generator=generator) * 0.1
    return extras


def make_checkpoint(spec: TextSpec, root: Path, seed: int = 0) -> CheckpointPair:
    """Write ``spec`` as a seeded random checkpoint under ``root/{saved,hub}``."""
    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    model = model_class(spec.model_type)(hf_config(spec)).eval()
    perturb_constants(model, generator)

    saved = root / "saved"
    hub = root / "hub"
    model.save_pretrained(saved)

    hub.mkdir(parents=True, exist_ok=True)
    tensors = load_file(saved / "model.safetensors")
    extras = _consumer_extras(spec, generator)
    tensors.update(extras)
    save_file(tensors, hub / "model.safetensors", metadata={"format": "pt"})
    hub_cfg = hub_style_config(spec)
    hub_cfg["transformers_version"] = json.loads((saved / "config.json").read_text())[
        "transformers_version"
    ]
    (hub / "config.json").write_text(json.dumps(hub_cfg, indent=2) + "\n")
    if (saved / "generation_config.json").exists():
        shutil.copy(saved / "generation_config.json", hub / "generation_config.json")
    return CheckpointPair(spec, saved, hub, tuple(sorted(extras)))
