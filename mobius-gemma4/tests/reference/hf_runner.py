"""Run a tiny HF Gemma 4 checkpoint on CPU in float32 and return its logits.

The reference for a prefill of ``P`` tokens followed by ``N`` single-token decode
steps is one causal no-cache forward over all ``P + N`` tokens: position ``t`` of
that forward sees exactly tokens ``0..t``, which is what the ORT package sees at
the same position after prefill + cached steps. ``hf_cached_logits`` runs HF's own
KV cache step by step as a cross-check of that equivalence.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def load_model(folder: Path, model_type: str):
    """Load the checkpoint at ``folder`` into its HF class, f32, eager attention."""
    import torch

    from reference.fixtures import model_class

    model = model_class(model_type).from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    """Logits ``[B, T, V]`` (float32) of one no-cache forward over ``ids [B, T]``."""
    import torch

    with torch.no_grad():
        t = torch.from_numpy(ids.astype(np.int64))
        out = model(input_ids=t, attention_mask=torch.ones_like(t), use_cache=False)
    return out.logits.float().numpy()


def hf_cached_logits(model, ids: np.ndarray, prefill: int) -> np.ndarray:
    """Logits ``[B, T, V]`` from HF's cache: prefill ``ids[:, :prefill]`` then one token a step."""
    import torch

    t = torch.from_numpy(ids.astype(np.int64))
    chunks = []
    with torch.no_grad():
        out = model(input_ids=t[:, :prefill], use_cache=True)
        chunks.append(out.logits.float())
        cache = out.past_key_values
        for s in range(prefill, t.shape[1]):
            out = model(
                input_ids=t[:, s : s + 1],
                attention_mask=torch.ones((t.shape[0], s + 1), dtype=torch.long),
                cache=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            chunks.append(out.logits.float())
    return torch.cat(chunks, dim=1).numpy()


def float64_twin(model):
    """A float64 copy of an HF ``Gemma4ForConditionalGeneration``, media features from ``model``.

    The exact-arithmetic stand-in a float32 run is measured against: how far HF's own f32
    logits are from it is the rounding noise of that input. HF's audio attention casts
    to float32 inside (``.float()`` in ``Gemma4AudioAttention``), so the towers cannot run
    in f64: the copy takes the image / audio features from the f32 ``model`` (cast to
    f64; the tests hold the package's features to HF f32's separately) and runs the
    embedding and decoder in f64.
    """
    import copy

    import torch

    twin = copy.deepcopy(model).double()

    def to_f32(x):
        return x.float() if torch.is_tensor(x) and x.is_floating_point() else x

    for name in ("get_image_features", "get_audio_features"):
        f32 = getattr(model.model, name)

        def features(*args, _f32=f32, **kwargs):
            out = _f32(*map(to_f32, args), **{k: to_f32(v) for k, v in kwargs.items()})
            pooled = out.pooler_output
            out.pooler_output = (
                pooled.double()
                if torch.is_tensor(pooled)
                else type(pooled)(p.double() for p in pooled)
            )
            return out

        setattr(twin.model, name, features)  # instance attribute: shadows the method
    return twin.eval()
