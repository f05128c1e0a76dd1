"""Weight plans of the ``gemma4_unified`` encoder graphs (HF ``Gemma4UnifiedForConditionalGeneration``).

Initializer names are HF's module parameter names without ``model.``; Linear weights
are transposed from HF's ``[out, in]`` to ``[in, out]``; everything is cast to the build
dtype at save time. The text components use :mod:`mobius_gemma4.weights.text` unchanged
(``model.language_model.*``, as for ``gemma4``).
"""

from __future__ import annotations

from mobius.checkpoint import Checkpoint
from mobius.errors import WeightPlanError
from mobius.records import BuildOptions
from mobius.weights import WeightPlan
from mobius_gemma4.config import Gemma4Config
from mobius_gemma4.weights.entries import CKPT_PREFIX, plan_from_entries

VISION_ENTRIES: tuple[tuple[str, str, bool], ...] = (
    ("embed_vision.patch_ln1.weight", "vision_embedder.patch_ln1.weight", False),
    ("embed_vision.patch_ln1.bias", "vision_embedder.patch_ln1.bias", False),
    ("embed_vision.patch_dense.weight", "vision_embedder.patch_dense.weight", True),
    ("embed_vision.patch_dense.bias", "vision_embedder.patch_dense.bias", False),
    ("embed_vision.patch_ln2.weight", "vision_embedder.patch_ln2.weight", False),
    ("embed_vision.patch_ln2.bias", "vision_embedder.patch_ln2.bias", False),
    ("embed_vision.pos_embedding", "vision_embedder.pos_embedding", False),
    ("embed_vision.pos_norm.weight", "vision_embedder.pos_norm.weight", False),
    ("embed_vision.pos_norm.bias", "vision_embedder.pos_norm.bias", False),
    (
        "embed_vision.multimodal_embedder.embedding_projection.weight",
        "embed_vision.embedding_projection.weight",
        True,
    ),
)
"""``(initializer = HF module name, on-disk name, transpose)``, both without ``model.``.

HF 5.24 renames on load (``conversion_mapping.py``, ``"gemma4_unified"``): the checkpoint
stores the patch embedder as ``vision_embedder.*`` and the final projection as
``embed_vision.embedding_projection``; ``save_pretrained`` writes those names back.
"""

AUDIO_ENTRIES: tuple[tuple[str, str, bool], ...] = (
    ("embed_audio.embedding_projection.weight", "embed_audio.embedding_projection.weight", True),
)


def _source(checkpoint: Checkpoint | None, module_name: str, disk_name: str) -> str:
    """The checkpoint tensor to read: the on-disk name, or the module name of a state dict
    saved without HF's renaming (used only when the on-disk name is absent)."""
    tensors = checkpoint.tensors if checkpoint is not None else {}
    disk, module = CKPT_PREFIX + disk_name, CKPT_PREFIX + module_name
    if disk not in tensors and module in tensors:
        return module
    return disk


def unified_weight_plan(
    config: Gemma4Config, component: str, checkpoint: Checkpoint | None, options: BuildOptions
) -> WeightPlan:
    """Plan of ``vision_encoder`` (``model.vision_embedder.*`` + ``model.embed_vision.*``) or
    ``audio_encoder`` (``model.embed_audio.*``)."""
    if component == "vision_encoder" and config.vision is not None:
        entries = VISION_ENTRIES
    elif component == "audio_encoder" and config.audio is not None:
        entries = AUDIO_ENTRIES
    else:
        raise WeightPlanError(
            f"no gemma4_unified weight plan for {component!r}",
            where="mobius_gemma4.unified.weights",
            fix="vision_encoder needs vision_config and audio_encoder needs audio_config",
        )
    return plan_from_entries(
        entries, options, source=lambda name, disk: _source(checkpoint, name, disk)
    )
