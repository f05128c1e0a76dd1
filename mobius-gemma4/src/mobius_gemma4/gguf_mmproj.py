"""A Gemma 4 GGUF model read with its ``mmproj`` companion file as the ``gemma4``
(``Gemma4ForConditionalGeneration``) checkpoint they came from: text decoder, vision and
audio encoders.

llama.cpp's converter writes the encoders to a separate file (``convert_hf_to_gguf.py
--mmproj``, class ``Gemma4VisionAudioModel``), ``general.architecture`` ``clip``. What it
stores and how it is read back (the text file is read by :mod:`mobius_gemma4.gguf`, its
tensors renamed under ``model.language_model.``):

- ``clip.vision.projector_type`` ``gemma4v`` (``clip.projector_type`` also accepted) and
  ``clip.audio.projector_type`` ``gemma4a``; ``clip.has_vision_encoder`` /
  ``clip.has_audio_encoder``; ``clip.{vision,audio}.projection_dim`` is the text hidden
  size (checked against the model file: a companion of another model is refused);
- vision: ``embedding_length`` (``hidden_size``), ``feed_forward_length``
  (``intermediate_size``), ``block_count``, ``attention.head_count``, ``patch_size``,
  ``attention.layer_norm_epsilon`` (``rms_norm_eps``), ``projector.scale_factor``
  (``pooling_kernel_size``; llama.cpp's default 3 when absent). ``image_size`` (the
  converter writes 224, "unused") and ``image_mean`` / ``image_std`` are not read (the
  Gemma 4 processor only rescales). From the tensors: ``head_dim`` (``attn_q_norm``),
  KV heads (``attn_k`` rows), ``position_embedding_size`` (``v.position_embd``),
  ``use_clipped_linears`` (clip bounds present), ``standardize`` (``v.std_bias``);
- audio: ``embedding_length``, ``block_count``, ``attention.head_count``,
  ``num_mel_bins`` (mobius's tower reads 128); from the tensors:
  ``subsampling_conv_channels`` (``a.conv1d.{0,1}``), ``conv_kernel_size``
  (``conv_dw``), ``output_proj_dims`` (``a.pre_encode.out``), ``use_clipped_linears``.
  ``attention.layer_norm_epsilon`` is not read: the converter writes 1e-5 whatever the
  checkpoint says (HF's is 1e-6); chunk / context sizes, logit cap, residual weight and
  gradient clipping are not stored either: HF 5.24's defaults, as for every shipped model;
- not stored at all: the per-image soft-token budget (``vision_soft_tokens_per_image``):
  HF's default 280 (llama.cpp's own maximum too);
- transforms undone: the patch embedding, stored as a conv kernel ``[hidden, 3, p, p]``
  (HF's ``[hidden, p·p·3]`` permuted), is served as stored and permuted back by the vision
  weight plan; the audio ``per_dim_scale`` was stored as ``softplus(w)`` (inverted here);
  the depthwise conv kernel lost its unit axis (``[h, k]``, served as ``[h, 1, k]``); the
  clip bounds became ``[1]`` (served as HF's scalars);
- names: ``v.blk.{i}.*`` / ``a.blk.{i}.*`` (gguf-py's ``MODEL_TENSOR`` names),
  ``mm.input_projection`` (``embed_vision``), ``mm.a.input_projection`` (``embed_audio``).
  A tensor not listed here is refused by core's opener, naming it.
- the media token ids come from the model's vocabulary (``<|image>``, ``<|image|>``,
  ``<image|>``, ``<|audio>``, ``<|audio|>``, ``<audio|>``, ``<|video|>``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from mobius.checkpoint.gguf import Transform
from mobius.errors import CheckpointError
from mobius.records import GGUFCompanion, GGUFTensor, GGUFTranslation

ARCHITECTURE = "gemma4"
CLIP = "clip"
VISION_TYPE = "gemma4v"
AUDIO_TYPE = "gemma4a"
DEFAULT_POOLING = 3
"""llama.cpp's ``n_merge`` for gemma4v when ``clip.vision.projector.scale_factor`` is
absent (HF ``pooling_kernel_size``)."""
MEL_BINS = 128

MEDIA_TOKENS = {
    "boi_token_id": "<|image>",
    "image_token_id": "<|image|>",
    "eoi_token_id": "<image|>",
    "boa_token_id": "<|audio>",
    "audio_token_id": "<|audio|>",
    "eoa_token_id": "<audio|>",
    "video_token_id": "<|video|>",
}
"""HF ``Gemma4Config`` media token key → the token's text in the vocabulary."""

BOUNDS = ("input_min", "input_max", "output_min", "output_max")

V = "model.vision_tower."
A = "model.audio_tower."
GLOBAL = {
    "v.patch_embd.weight": V + "patch_embedder.input_proj.weight",
    "v.position_embd.weight": V + "patch_embedder.position_embedding_table",
    "v.std_bias": V + "std_bias",
    "v.std_scale": V + "std_scale",
    "mm.input_projection.weight": "model.embed_vision.embedding_projection.weight",
    "a.conv1d.0.weight": A + "subsample_conv_projection.layer0.conv.weight",
    "a.conv1d.0.norm.weight": A + "subsample_conv_projection.layer0.norm.weight",
    "a.conv1d.1.weight": A + "subsample_conv_projection.layer1.conv.weight",
    "a.conv1d.1.norm.weight": A + "subsample_conv_projection.layer1.norm.weight",
    "a.input_projection.weight": A + "subsample_conv_projection.input_proj_linear.weight",
    "a.pre_encode.out.weight": A + "output_proj.weight",
    "a.pre_encode.out.bias": A + "output_proj.bias",
    "mm.a.input_projection.weight": "model.embed_audio.embedding_projection.weight",
}
"""GGUF name → HF name of the encoders' tensors outside the layers."""

VISION_LAYER = {
    "attn_q": ("self_attn.q_proj", True),
    "attn_k": ("self_attn.k_proj", True),
    "attn_v": ("self_attn.v_proj", True),
    "attn_out": ("self_attn.o_proj", True),
    "ffn_gate": ("mlp.gate_proj", True),
    "ffn_up": ("mlp.up_proj", True),
    "ffn_down": ("mlp.down_proj", True),
    "attn_q_norm": ("self_attn.q_norm", False),
    "attn_k_norm": ("self_attn.k_norm", False),
    "ln1": ("input_layernorm", False),
    "attn_post_norm": ("post_attention_layernorm", False),
    "ln2": ("pre_feedforward_layernorm", False),
    "ffn_post_norm": ("post_feedforward_layernorm", False),
}
"""``v.blk.{i}.<name>`` → (HF module under ``vision_tower.encoder.layers.{i}.``, whether it
is a clippable linear: weight under ``.linear``, clip bounds beside it)."""

AUDIO_LAYER = {
    "ffn_up": ("feed_forward1.ffw_layer_1", True),
    "ffn_down": ("feed_forward1.ffw_layer_2", True),
    "ffn_up_1": ("feed_forward2.ffw_layer_1", True),
    "ffn_down_1": ("feed_forward2.ffw_layer_2", True),
    "ffn_norm": ("feed_forward1.pre_layer_norm", False),
    "ffn_post_norm": ("feed_forward1.post_layer_norm", False),
    "ffn_norm_1": ("feed_forward2.pre_layer_norm", False),
    "ffn_post_norm_1": ("feed_forward2.post_layer_norm", False),
    "attn_q": ("self_attn.q_proj", True),
    "attn_k": ("self_attn.k_proj", True),
    "attn_v": ("self_attn.v_proj", True),
    "attn_out": ("self_attn.post", True),
    "attn_k_rel": ("self_attn.relative_k_proj", False),
    "conv_pw1": ("lconv1d.linear_start", True),
    "conv_pw2": ("lconv1d.linear_end", True),
    "conv_norm": ("lconv1d.pre_layer_norm", False),
    "norm_conv": ("lconv1d.conv_norm", False),
    "attn_pre_norm": ("norm_pre_attn", False),
    "attn_post_norm": ("norm_post_attn", False),
    "ln2": ("norm_out", False),
}
"""``a.blk.{i}.<name>`` → (HF module under ``audio_tower.layers.{i}.``, clippable).
``conv_dw`` and ``per_dim_scale`` are handled apart (their transforms)."""


# --------------------------------------------------------------------------- transforms


@dataclass(frozen=True)
class _Reshape(Transform):
    """Serve a tensor under HF's shape: llama.cpp dropped a unit axis (a depthwise conv
    kernel ``[c, 1, k]`` stored ``[c, k]``) or added one (a clip bound ``[]`` stored
    ``[1]``). The row length (last axis) and the values stay."""

    shape: tuple[int, ...]
    moves_rows = True

    def out_shape(self, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
        same_rows = (shape[-1:] or (1,)) == (self.shape[-1:] or (1,))
        if math.prod(shape) != math.prod(self.shape) or not same_rows:
            raise CheckpointError(
                f"tensor of shape {list(shape)} cannot be read as {list(self.shape)}",
                where=where,
                fix="convert the model again with llama.cpp's convert_hf_to_gguf.py --mmproj",
            )
        return self.shape

    def apply(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return rows


@dataclass(frozen=True)
class _InverseSoftplus(Transform):
    """Undo the ``softplus`` llama.cpp's converter applies to Gemma 4's audio
    ``per_dim_scale`` (HF applies it in the forward pass): ``w = log(exp(y) − 1)``."""

    where: str = ""

    def apply(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        y = rows.astype(np.float64)
        if not np.all(y > 0):
            raise CheckpointError(
                "a per_dim_scale value is not positive, so it is no softplus output",
                where=self.where,
                fix="convert the model again with llama.cpp's convert_hf_to_gguf.py --mmproj",
            )
        # log(exp(y) − 1) = y + log(1 − exp(−y)), exact-ish for every y > 0
        return (y + np.log(-np.expm1(-y))).astype(rows.dtype)


# --------------------------------------------------------------------------- translation


def translate_with_companion(
    architecture: str,
    metadata: Mapping[str, Any],
    tensors: Mapping[str, tuple[int, ...]],
    companion: GGUFCompanion,
) -> GGUFTranslation | None:
    """The ``gemma4`` config and tensor names of a Gemma 4 GGUF model and its mmproj file
    (None for other architectures)."""
    if architecture != ARCHITECTURE:
        return None
    from mobius.checkpoint.gguf_tokenizer import special_ids
    from mobius_gemma4.gguf import translate

    base = translate(architecture, metadata, tensors)
    assert base is not None
    text = dict(base.config)
    text.pop("architectures", None)
    ids = special_ids(metadata)
    text.update(ids)
    reader = _Companion(companion, int(text["hidden_size"]))
    vision, audio = reader.vision_config(), reader.audio_config()
    config: dict[str, Any] = {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text,
        "vision_config": vision,
        "audio_config": audio,
        "tie_word_embeddings": bool(text.get("tie_word_embeddings", True)),
        **ids,
        **_media_ids(metadata, companion.file),
    }
    config["eoa_token_index"] = config["eoa_token_id"]
    names: dict[str, str | GGUFTensor | None] = {}
    for name, target in base.tensors.items():
        names[name] = _under_language_model(target)
    names.update(reader.names(vision, audio))
    return GGUFTranslation(config=config, tensors=names)


def _under_language_model(target: str | GGUFTensor | None) -> str | GGUFTensor | None:
    """A ``gemma4_text`` weight name as ``Gemma4ForConditionalGeneration`` stores it."""
    if target is None:
        return None
    name = target if isinstance(target, str) else target.name
    if name.startswith("model."):
        name = "model.language_model." + name[len("model.") :]
    return name if isinstance(target, str) else GGUFTensor(name, target.transforms)


def _media_ids(metadata: Mapping[str, Any], where: str) -> dict[str, int]:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        _fail("the Gemma 4 GGUF model has no tokenizer.ggml.tokens to find its media tokens",
              where, "convert the model again with llama.cpp's convert_hf_to_gguf.py")  # fmt: skip
    index = {
        t: i for i, t in enumerate(tokens) if isinstance(t, str) and t in MEDIA_TOKENS.values()
    }
    missing = [t for t in MEDIA_TOKENS.values() if t not in index]
    if missing:
        _fail(
            f"the model's vocabulary has no {', '.join(missing)} (Gemma 4's media tokens), "
            "so it cannot take this mmproj file's images or audio",
            where,
            "pass the model's own mmproj file, or --mmproj none for a text-only package",
        )
    return {key: index[token] for key, token in MEDIA_TOKENS.items()}


class _Companion:
    """Reads one mmproj file's metadata and tensor shapes (every read checked)."""

    def __init__(self, companion: GGUFCompanion, text_hidden: int) -> None:
        self.meta = companion.metadata
        self.shapes = companion.tensors
        self.where = companion.file
        arch = self.meta.get("general.architecture")
        if arch != CLIP:
            self.fail(
                f"this is no mmproj file: its general.architecture is {_show(arch)}, not 'clip'"
            )
        self.has_vision = self.meta.get("clip.has_vision_encoder") is True
        self.has_audio = self.meta.get("clip.has_audio_encoder") is True
        if not self.has_vision:
            self.fail("the mmproj file has no vision encoder (clip.has_vision_encoder)")
        kind = self.meta.get("clip.vision.projector_type", self.meta.get("clip.projector_type"))
        if kind != VISION_TYPE:
            self.fail(f"the mmproj file's vision projector is {_show(kind)}, not Gemma 4's "
                      f"{VISION_TYPE!r}: it belongs to another model")  # fmt: skip
        if self.has_audio and self.meta.get("clip.audio.projector_type") != AUDIO_TYPE:
            self.fail(
                f"the mmproj file's audio projector is "
                f"{_show(self.meta.get('clip.audio.projector_type'))}, not Gemma 4's "
                f"{AUDIO_TYPE!r}: it belongs to another model"
            )
        for part in ("vision",) + (("audio",) if self.has_audio else ()):
            dim = self.int(f"clip.{part}.projection_dim")
            if dim != text_hidden:
                self.fail(
                    f"the mmproj file's {part} encoder projects to width {dim}, the model's "
                    f"hidden size is {text_hidden}: it belongs to another model"
                )

    def fail(self, what: str) -> NoReturn:
        _fail(what, self.where, "pass the mmproj file made for this model (--mmproj FILE), or "
              "--mmproj none for a text-only package")  # fmt: skip

    def int(self, key: str, default: int | None = None) -> int:
        value = self.meta.get(key, default)
        if value is None:
            self.fail(f"the mmproj file has no {key}")
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1 << 24:
            self.fail(f"{key} is {_show(value)}, not a positive integer")
        return value

    def shape(self, name: str, ndim: int) -> tuple[int, ...]:
        shape = self.shapes.get(name)
        if shape is None:
            self.fail(f"the mmproj file has no tensor {name}")
        if len(shape) != ndim:
            self.fail(f"tensor {name} has shape {list(shape)}, not {ndim}-D")
        return tuple(shape)

    def vision_config(self) -> dict[str, Any]:
        p = "clip.vision."
        hidden = self.int(p + "embedding_length")
        heads = self.int(p + "attention.head_count")
        layers = self.int(p + "block_count")
        head_dim = self.shape("v.blk.0.attn_q_norm.weight", 1)[0]
        kv = self.shape("v.blk.0.attn_k.weight", 2)[0] // head_dim
        patch = self.int(p + "patch_size")
        want = (hidden, 3, patch, patch)
        if self.shape("v.patch_embd.weight", 4) != want:
            self.fail(f"v.patch_embd.weight has shape {list(self.shapes['v.patch_embd.weight'])}"
                      f", not {list(want)} (hidden, RGB, patch, patch)")  # fmt: skip
        table = self.shape("v.position_embd.weight", 3)
        eps = self.meta.get(p + "attention.layer_norm_epsilon", 1e-6)
        if not isinstance(eps, float) or not 0 < eps < 1:
            self.fail(
                f"{p}attention.layer_norm_epsilon is {_show(eps)}, not a small positive float"
            )
        return {
            "model_type": "gemma4_vision",
            "hidden_size": hidden,
            "intermediate_size": self.int(p + "feed_forward_length"),
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": head_dim,
            "patch_size": patch,
            "pooling_kernel_size": self.int(p + "projector.scale_factor", DEFAULT_POOLING),
            "position_embedding_size": table[1],
            "use_clipped_linears": "v.blk.0.attn_q.input_min" in self.shapes,
            "standardize": "v.std_bias" in self.shapes,
            "rms_norm_eps": eps,
        }

    def audio_config(self) -> dict[str, Any] | None:
        if not self.has_audio:
            return None
        p = "clip.audio."
        hidden = self.int(p + "embedding_length")
        mel = self.int(p + "num_mel_bins", MEL_BINS)
        if mel != MEL_BINS:
            self.fail(f"{p}num_mel_bins is {mel}; Gemma 4's audio tower reads {MEL_BINS}")
        channels = [self.shape(f"a.conv1d.{i}.weight", 4)[0] for i in (0, 1)]
        up = self.shape("a.blk.0.ffn_up.weight", 2)
        if up[0] != 4 * hidden:
            self.fail(f"a.blk.0.ffn_up.weight has {up[0]} rows, not 4 × {hidden}")
        return {
            "model_type": "gemma4_audio",
            "hidden_size": hidden,
            "num_hidden_layers": self.int(p + "block_count"),
            "num_attention_heads": self.int(p + "attention.head_count"),
            "subsampling_conv_channels": channels,
            "conv_kernel_size": self.shape("a.blk.0.conv_dw.weight", 2)[1],
            "output_proj_dims": self.shape("a.pre_encode.out.weight", 2)[0],
            "use_clipped_linears": "a.blk.0.attn_q.input_min" in self.shapes,
        }

    def names(
        self, vision: Mapping[str, Any], audio: Mapping[str, Any] | None
    ) -> dict[str, str | GGUFTensor]:
        """GGUF name → HF name (with transforms) of every encoder tensor this file may
        hold; a tensor left out is refused by core's opener."""
        out: dict[str, str | GGUFTensor] = {}
        for name, shape in self.shapes.items():
            if name.startswith(("a.", "mm.a.")) and audio is None:
                continue  # refused as unknown: audio tensors without an audio encoder
            hf = self._name(name, shape, vision, audio)
            if hf is not None:
                out[name] = hf
        return out

    def _name(self, name, shape, vision, audio) -> str | GGUFTensor | None:
        if name in GLOBAL:
            return GLOBAL[name]
        parts = name.split(".")
        if len(parts) != 5 or parts[1] != "blk" or not parts[2].isdigit():
            return None
        tower, layer, module, suffix = parts[0], int(parts[2]), parts[3], parts[4]
        if tower == "v" and layer < vision["num_hidden_layers"]:
            table, prefix = VISION_LAYER, f"{V}encoder.layers.{layer}."
        elif tower == "a" and audio is not None and layer < audio["num_hidden_layers"]:
            table, prefix = AUDIO_LAYER, f"{A}layers.{layer}."
            if module == "conv_dw" and suffix == "weight" and len(shape) == 2:
                hf = prefix + "lconv1d.depthwise_conv1d.weight"
                return GGUFTensor(hf, (_Reshape((shape[0], 1, shape[1])),))
            if module == "per_dim_scale" and suffix == "weight":
                where = f"{self.where}, tensor {name!r}"
                return GGUFTensor(prefix + "self_attn.per_dim_scale", (_InverseSoftplus(where),))
        else:
            return None
        entry = table.get(module)
        if entry is None:
            return None
        hf_module, clippable = entry
        if suffix == "weight":
            return prefix + hf_module + (".linear.weight" if clippable else ".weight")
        if clippable and suffix in BOUNDS:
            return GGUFTensor(f"{prefix}{hf_module}.{suffix}", (_Reshape(()),))
        return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


def _fail(what: str, where: str, fix: str) -> NoReturn:
    raise CheckpointError(what, where=where, fix=fix)
