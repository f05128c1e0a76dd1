"""The tiny ``gemma4_unified`` fixture: config, seeded HF checkpoint and HF helpers.

The text part is the k_eq_v decoder of the ``bidir-mm`` spec (4 layers, sliding window 8,
``use_bidirectional_attention = "vision"``, full layers with 1 KV head and head dim 32)
with ``hidden_size_per_layer_input`` 16 in the JSON: HF's ``Gemma4UnifiedTextConfig`` has
no PLE and ignores it, so a reader that honoured it would build a different model. The
embedders are tiny (``mm_embed_dim`` 32, 16 positions per axis) except for the real input
widths (48×48×3 patches, 640-sample frames). Every constant-initialised tensor (LayerNorm
weights and biases, RMSNorm weights, ``layer_scalar``, the Dense bias) is perturbed by
:func:`reference.fixtures.perturb_constants`. torch and transformers are imported inside
the functions only.
"""

from __future__ import annotations

import ast
import copy
import math
from pathlib import Path
from typing import Any

from reference.specs import MM_TOKEN_IDS

UNIFIED_TEXT: dict[str, Any] = {
    "model_type": "gemma4_unified_text",
    "vocab_size": 1024,
    "hidden_size": 64,
    "hidden_size_per_layer_input": 16,  # ignored by HF's unified text model (no PLE)
    "vocab_size_per_layer_input": 1024,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "layer_types": [
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    ],
    "sliding_window": 8,
    "num_kv_shared_layers": 0,
    "use_double_wide_mlp": False,
    "final_logit_softcapping": 3.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
    "initializer_range": 0.05,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "use_bidirectional_attention": "vision",
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "rope_parameters": {
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
}
UNIFIED_VISION: dict[str, Any] = {
    "model_type": "gemma4_unified_vision",
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "mm_embed_dim": 32,
    "mm_posemb_size": 16,
    "output_proj_dims": 32,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.05,
}
UNIFIED_AUDIO: dict[str, Any] = {
    "model_type": "gemma4_unified_audio",
    "audio_embed_dim": 640,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.05,
}


def unified_config_json() -> dict[str, Any]:
    """The hub-style ``config.json`` of the tiny unified model."""
    return {
        "architectures": ["Gemma4UnifiedForConditionalGeneration"],
        "model_type": "gemma4_unified",
        "text_config": copy.deepcopy(UNIFIED_TEXT),
        "vision_config": copy.deepcopy(UNIFIED_VISION),
        "audio_config": copy.deepcopy(UNIFIED_AUDIO),
        "tie_word_embeddings": True,
        "initializer_range": 0.05,
        **MM_TOKEN_IDS,
    }


def hf_unified_config() -> Any:
    from transformers.models.gemma4_unified import configuration_gemma4_unified as c

    raw = unified_config_json()

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k != "model_type"}

    extra = {k: v for k, v in raw.items() if k.endswith(("_token_id", "_token_index"))}
    return c.Gemma4UnifiedConfig(
        text_config=c.Gemma4UnifiedTextConfig(**strip(raw["text_config"])),
        vision_config=c.Gemma4UnifiedVisionConfig(**strip(raw["vision_config"])),
        audio_config=c.Gemma4UnifiedAudioConfig(**strip(raw["audio_config"])),
        initializer_range=raw["initializer_range"],
        **extra,
    )


def make_unified_checkpoint(root: Path, seed: int = 0) -> Path:
    """Write the seeded tiny model with ``save_pretrained``; returns the folder."""
    import torch
    from transformers.models.gemma4_unified.modeling_gemma4_unified import (
        Gemma4UnifiedForConditionalGeneration,
    )

    from reference.fixtures import perturb_constants

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    model = Gemma4UnifiedForConditionalGeneration(hf_unified_config()).eval()
    changed = perturb_constants(model, generator)
    for name in ("patch_ln1.bias", "patch_dense.bias", "pos_norm.weight", "layer_scalar"):
        assert any(n.endswith(name) for n in changed), name
    model.save_pretrained(root)
    return root


def load_unified(folder: Path):
    """The checkpoint in HF's class, float32, eager attention."""
    import torch
    from transformers.models.gemma4_unified.modeling_gemma4_unified import (
        Gemma4UnifiedForConditionalGeneration,
    )

    model = Gemma4UnifiedForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def hf_patch_functions() -> dict[str, Any]:
    """HF 5.24's ``convert_image_to_patches`` and ``patches_merge``, without torchvision.

    ``image_processing_gemma4_unified`` refuses to import without torchvision (not in this
    venv), but these two torch functions hold the whole 48-px merge order; they are taken
    from the module's source text unchanged and run with torch.
    """
    import torch
    import transformers

    src = (
        Path(transformers.__file__).parent
        / "models"
        / "gemma4_unified"
        / "image_processing_gemma4_unified.py"
    ).read_text()
    tree = ast.parse(src)
    wanted = {"convert_image_to_patches", "patches_merge"}
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {f.name for f in funcs} == wanted
    module = ast.Module(body=funcs, type_ignores=[])
    namespace: dict[str, Any] = {"torch": torch, "math": math}
    exec(compile(module, "image_processing_gemma4_unified.py", "exec"), namespace)
    return {name: namespace[name] for name in wanted}
