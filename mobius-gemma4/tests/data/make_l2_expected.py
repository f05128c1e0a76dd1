"""One-off: compute the L2 expectations with HF transformers 5.24 on the meta device.

Run: python mobius-gemma4/tests/data/make_l2_expected.py
Writes l2_expected.json next to this file. The L2 test itself never imports torch.

Counting rules (matching how the mobius graphs hold weights):
- embedding = embed_tokens + embed_tokens_per_layer + per_layer_model_projection
  + per_layer_projection_norm (HF ``model.language_model.*`` tensors of those names);
- decoder = every other ``model.language_model.*`` parameter and buffer that is a real
  checkpoint tensor (``layer_scalar``) + the lm_head copy (V·H; tied heads are counted
  again in the decoder because the split package stores a second copy).
- model (single graph of gemma4_text) = embedding + decoder − V·H when tied (one shared table).
- vision_encoder = ``model.vision_tower.*`` + ``model.embed_vision.*`` parameters and
  persistent buffers (clip bounds, std_bias/std_scale) that a checkpoint carries;
  audio_encoder likewise for ``audio_tower`` / ``embed_audio`` (only with audio_config).
  gemma4_unified (12B) has no towers: its encoders are ``embed_vision`` / ``embed_audio``.
"""

import json
from pathlib import Path

import torch
from transformers import (
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4UnifiedConfig,
    Gemma4UnifiedForConditionalGeneration,
)

HERE = Path(__file__).parent
CONFIGS = Path(__file__).resolve().parents[3] / "testdata" / "configs"
CLASSES = {
    "gemma4": (Gemma4Config, Gemma4ForConditionalGeneration),
    "gemma4_unified": (Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration),
}
EMBED = (
    "embed_tokens.",
    "embed_tokens_per_layer.",
    "per_layer_model_projection.",
    "per_layer_projection_norm.",
)

out = {}
for path in sorted(CONFIGS.glob("gemma-4-*.json")):
    raw = json.loads(path.read_text())
    if raw.get("model_type") not in CLASSES:
        continue
    config_class, model_class = CLASSES[raw["model_type"]]
    kw = {
        k: v
        for k, v in raw.items()
        if k not in ("architectures", "transformers_version", "model_type")
    }
    config = config_class(**kw)
    with torch.device("meta"):
        model = model_class(config)
    lm = model.model.language_model
    tc = config.text_config
    emb = dec = 0
    tensors = dict(lm.named_parameters())
    tensors.update({n: b for n, b in lm.named_buffers() if n.endswith("layer_scalar")})
    for name, t in tensors.items():
        if name.startswith(EMBED):
            emb += t.numel()
        else:
            dec += t.numel()
    dec += tc.vocab_size * tc.hidden_size
    L = tc.num_hidden_layers
    first = L - tc.num_kv_shared_layers
    cache = []
    for i in range(first):
        attn = lm.layers[i].self_attn
        cache.append([attn.k_proj.out_features // attn.head_dim, attn.head_dim])
    towers = {}
    for comp, names in (
        ("vision_encoder", ("vision_tower", "embed_vision")),
        ("audio_encoder", ("audio_tower", "embed_audio")),
    ):
        # gemma4_unified has no towers, only the embed_vision / embed_audio embedders.
        mods = [m for n in names if (m := getattr(model.model, n, None)) is not None]
        if not mods:
            continue
        towers[comp] = sum(t.numel() for m in mods for t in m.state_dict().values())
    out[path.name] = {
        "model_type": raw["model_type"],
        "num_cache_layers": first,
        "cache_geometry": cache,
        "embedding_params": emb,
        "decoder_params": dec,
        "language_model_params": sum(t.numel() for t in tensors.values()),
        "encoder_params": towers,
    }
(HERE / "l2_expected.json").write_text(json.dumps(out, indent=2) + "\n")
print(
    json.dumps(
        {k: {kk: v for kk, v in d.items() if kk != "cache_geometry"} for k, d in out.items()},
        indent=1,
    )
)
