"""Gemma 4 preprocessing (docs/gemma4.md §1, §5.1, §6.1): chat layout, media, stop ids.

-it models: ``<bos><|turn>user\\n`` + one ``<|image|>`` per image + one ``<|audio|>`` per
clip + text + ``<turn|>\\n<|turn>model\\n``; generation stops on the eos ids the
checkpoint declares (-it checkpoints list ``<turn|>``, 106, among them).
:func:`expand_prompt` turns each placeholder into ``begin + n × placeholder + end`` with
exactly the soft-token count the encoder emits for that item, as HF's ``Gemma4Processor`` does. Images and audio are processed in numpy
(:mod:`mobius_gemma4.vision.processor`, :mod:`mobius_gemma4.audio.features`); arrays are
float32 and the runtime casts them to the port dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mobius.config import eos_ids, generation_eos
from mobius.errors import MobiusError
from mobius.records import Processors
from mobius_gemma4.config import Gemma4Config

IMAGE_BEGIN, IMAGE_TOKEN, IMAGE_END = "<|image>", "<|image|>", "<image|>"
AUDIO_BEGIN, AUDIO_TOKEN, AUDIO_END = "<|audio>", "<|audio|>", "<audio|>"
DEFAULT_SOFT_TOKENS = 280


def format_chat_prompt(text: str, images: int = 0, audio: int = 0) -> str:
    """The -it chat layout for one user message with its media placeholders (unexpanded)."""
    media = IMAGE_TOKEN * images + AUDIO_TOKEN * audio
    return f"<bos><|turn>user\n{media}{text}<turn|>\n<|turn>model\n"


def _expand(text: str, token: str, begin: str, end: str, counts: Sequence[int]) -> str:
    parts = text.split(token)
    if len(parts) - 1 != len(counts):
        raise MobiusError(
            f"the prompt has {len(parts) - 1} {token} placeholder(s) but {len(counts)} "
            f"item(s) were processed",
            where="Gemma 4 prompt expansion",
            fix=f"put exactly one {token} in the prompt per item, in order",
        )
    out = [parts[0]]
    for n, rest in zip(counts, parts[1:]):
        out.append(begin + token * int(n) + end + rest)
    return "".join(out)


def expand_prompt(text: str, image_tokens: Sequence[int], audio_tokens: Sequence[int]) -> str:
    """Each ``<|image|>`` / ``<|audio|>`` → begin + n × placeholder + end, in order."""
    text = _expand(text, IMAGE_TOKEN, IMAGE_BEGIN, IMAGE_END, image_tokens)
    return _expand(text, AUDIO_TOKEN, AUDIO_BEGIN, AUDIO_END, audio_tokens)


def max_soft_tokens(config: Gemma4Config) -> int:
    """Per-image soft-token budget: the checkpoint's, else HF's default 280."""
    raw = config.raw or {}
    vision = config.vision
    value = raw.get("vision_soft_tokens_per_image") or (vision and vision.default_output_length)
    return int(value) if value else DEFAULT_SOFT_TOKENS


def image_preprocessor(config: Gemma4Config):
    """``images → {pixel_values, pixel_position_ids, num_soft_tokens}`` for this checkpoint."""
    if config.model_type == "gemma4_unified":  # 48-px merged patches (docs/gemma4.md §7)
        from mobius_gemma4.unified.processor import UnifiedImageProcessor

        uc = config.vision

        def make_processor() -> Any:
            return UnifiedImageProcessor(
                patch_size=uc.patch_size,
                pooling_kernel_size=uc.pooling_kernel_size,
                max_soft_tokens=uc.num_soft_tokens,
                position_embedding_size=uc.mm_posemb_size,
            )

    else:
        from mobius_gemma4.vision import Gemma4ImageProcessor

        vc = config.vision

        def make_processor() -> Any:
            return Gemma4ImageProcessor(
                patch_size=vc.patch_size,
                pooling_kernel_size=vc.pooling_kernel_size,
                max_soft_tokens=max_soft_tokens(config),
                position_embedding_size=vc.position_embedding_size,
            )

    def preprocess_image(images: Sequence[Any]) -> dict[str, Any]:
        batch = make_processor()(list(images))  # here, so a bad budget fails only image requests
        return {
            "pixel_values": batch.pixel_values,
            "pixel_position_ids": batch.pixel_position_ids,
            "num_soft_tokens": list(batch.num_soft_tokens),
        }

    return preprocess_image


def audio_preprocessor(config: Gemma4Config):
    """``clips → {input_features, input_features_mask, num_soft_tokens}`` for this checkpoint.

    ``gemma4``: 16 kHz log-mel features; ``gemma4_unified``: raw 640-sample frames
    (docs/gemma4.md §7).
    """
    from mobius_gemma4.audio import load_audio

    if config.model_type == "gemma4_unified":
        from mobius_gemma4.unified.processor import UnifiedAudioFrames

        extractor: Any = UnifiedAudioFrames(config.audio.audio_embed_dim)
        max_samples = None  # no clip length cap known for the unified model
    else:
        from mobius_gemma4.audio import Gemma4AudioFeatureExtractor

        extractor = Gemma4AudioFeatureExtractor(feature_size=config.audio.num_mel_bins)
        max_samples = extractor.max_samples  # 30 s: cut before resampling

    def preprocess_audio(clips: Sequence[Any]) -> dict[str, Any]:
        batch = extractor([load_audio(c, max_samples=max_samples) for c in clips])
        return {
            "input_features": batch.input_features,
            "input_features_mask": batch.input_features_mask,
            "num_soft_tokens": list(batch.num_soft_tokens),
        }

    return preprocess_audio


def stop_token_ids(
    config: Gemma4Config, generation_eos_ids: list[int] | int | None = None
) -> tuple[int, ...]:
    """The ids that end generation: every eos id the checkpoint declares.

    The text config's ``eos_token_id``, the top-level one (-it checkpoints list
    ``[1, 106]`` there: ``<turn|>`` ends a chat turn) and generation_config's.
    No id is assumed: a tiny vocabulary may use 106 for an ordinary token.
    """
    top = config.raw.get("eos_token_id") if config.raw else None
    return eos_ids(config.text.eos_token_id, top, generation_eos_ids)


def text_processors(config: Gemma4Config) -> Processors:
    """All of a package's processors (the name predates media; kept for the plugin hook)."""
    from mobius_gemma4.ports import has_audio, has_vision

    # the package's generation_config.json, attached by the runtime (mobius_processors)
    eos = generation_eos(config.raw) if config.raw else None
    media = has_vision(config) or has_audio(config)
    return Processors(
        format_prompt=format_chat_prompt,
        preprocess_image=image_preprocessor(config) if has_vision(config) else None,
        preprocess_audio=audio_preprocessor(config) if has_audio(config) else None,
        expand_prompt=expand_prompt if media else None,
        stop_token_ids=stop_token_ids(config, eos),
        bos_token_id=config.text.bos_token_id,
    )
