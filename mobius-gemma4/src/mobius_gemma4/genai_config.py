"""Runtime files of a Gemma 4 package (docs/gemma4.md §10): ``genai_config.json``, the
onnxruntime-extensions processor configs ``image_processor.json`` / ``audio_processor.json``
of a multimodal package, and the checkpoint's tokenizer files (copied when present).

onnxruntime-genai 0.18 always needs a ``vision`` section for ``gemma4`` and a ``speech``
section whose ``config_filename`` is empty when there is no audio tower; a ``speech``
section naming an encoder must name its processor config too (it refuses to load
otherwise). ``gemma4_unified`` gets the same sections, with its own processor
operators: ``Gemma4ImageTransform`` at the unified patch / pooling sizes and
``Gemma4UnifiedAudioFrames`` (raw 640-sample frames). Its text prompts are checked
against onnxruntime-genai (``mobius-runtime/tests/genai/check_genai.py``); its image
and audio prompts are not yet.
"""

from __future__ import annotations

import json

from mobius.config import generation_eos
from mobius.lm.runtime import genai_search
from mobius.records import BuildOptions, RuntimeFile
from mobius_gemma4.config import Gemma4Config


def genai_config(config: Gemma4Config, eos: list[int]) -> dict:
    text = config.text
    common = {
        "bos_token_id": text.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": text.pad_token_id,
        "context_length": text.max_position_embeddings,
        "vocab_size": text.vocab_size,
    }
    if config.model_type == "gemma4_text":
        model = {"type": "gemma4_text", **common, "decoder": {"filename": "model/model.onnx"}}
    else:
        decoder: dict = {"filename": "decoder/model.onnx", "hidden_size": text.hidden_size}
        embedding: dict = {"filename": "embedding/model.onnx"}
        if text.has_ple:
            decoder["inputs"] = {"per_layer_inputs": "per_layer_inputs"}
            embedding["outputs"] = {"per_layer_inputs": "per_layer_inputs"}
        model = {"type": config.model_type, **common, "decoder": decoder, "embedding": embedding}
        model.update(media_sections(config))
    return {"model": model, "search": genai_search(text.max_position_embeddings)}


IMAGE_PROCESSOR, AUDIO_PROCESSOR = "image_processor.json", "audio_processor.json"


def media_sections(config: Gemma4Config) -> dict:
    """The ``vision`` and ``speech`` sections of a ``gemma4`` genai_config."""
    from mobius_gemma4.ports import has_audio, has_vision

    vision: dict = {}
    if has_vision(config):
        vision = {"filename": "vision_encoder/model.onnx", "config_filename": IMAGE_PROCESSOR}
    speech: dict = {"config_filename": ""}
    if has_audio(config):
        speech = {
            "filename": "audio_encoder/model.onnx",
            "config_filename": AUDIO_PROCESSOR,
            "inputs": {"audio_embeds": "input_features", "attention_mask": "input_features_mask"},
        }
    return {"vision": vision, "speech": speech}


def image_processor_json(config: Gemma4Config) -> dict:
    if config.model_type == "gemma4_unified":
        uc = config.vision
        attrs = {
            "patch_size": uc.patch_size,
            "max_soft_tokens": uc.num_soft_tokens,
            "pooling_kernel_size": uc.pooling_kernel_size,
        }
    else:
        from mobius_gemma4.processors import max_soft_tokens

        vc = config.vision
        attrs = {
            "patch_size": vc.patch_size,
            "max_soft_tokens": max_soft_tokens(config),
            "pooling_kernel_size": vc.pooling_kernel_size,
        }
    return {
        "processor": {
            "name": "gemma4_image_processor",
            "transforms": [
                {
                    "operation": {
                        "name": "decode_image",
                        "type": "DecodeImage",
                        "attrs": {"color_space": "RGB"},
                    }
                },
                {
                    "operation": {
                        "name": "gemma4_image_transform",
                        "type": "Gemma4ImageTransform",
                        "attrs": attrs,
                    }
                },
            ],
        }
    }


def audio_processor_json(config: Gemma4Config) -> dict:
    if config.model_type == "gemma4_unified":
        frames = {
            "audio_samples_per_token": config.audio.audio_embed_dim,
            "sampling_rate": 16000,
        }
        return {
            "feature_extraction": {
                "sequence": [
                    {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
                    {
                        "operation": {
                            "name": "gemma4_unified_audio_frames",
                            "type": "Gemma4UnifiedAudioFrames",
                            "attrs": frames,
                        }
                    },
                ]
            }
        }
    ac = config.audio
    attrs = {
        "feature_size": ac.num_mel_bins,
        "sampling_rate": 16000,
        "frame_length_ms": 20.0,
        "hop_length_ms": 10.0,
        "min_frequency": 0.0,
        "max_frequency": 8000.0,
        "preemphasis": 0.0,
        "preemphasis_htk_flavor": 1,
        "fft_overdrive": 0,
        "mel_floor": 0.001,
    }
    return {
        "feature_extraction": {
            "sequence": [
                {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
                {"operation": {"name": "gemma4_log_mel", "type": "Gemma4LogMel", "attrs": attrs}},
            ]
        }
    }


def runtime_files(
    config: Gemma4Config, contract, checkpoint, options: BuildOptions
) -> list[RuntimeFile]:
    from mobius_gemma4.processors import stop_token_ids

    files: list[RuntimeFile] = []
    gen_path = checkpoint.file("generation_config.json") if checkpoint is not None else None
    eos = list(stop_token_ids(config, generation_eos(gen_path)))
    files.append(
        RuntimeFile(
            "genai_config.json", content=json.dumps(genai_config(config, eos), indent=2).encode()
        )
    )
    from mobius_gemma4.ports import has_audio, has_vision

    for present, name, make in (
        (has_vision(config), IMAGE_PROCESSOR, image_processor_json),
        (has_audio(config), AUDIO_PROCESSOR, audio_processor_json),
    ):
        if present:
            files.append(RuntimeFile(name, content=json.dumps(make(config), indent=2).encode()))
    return files  # tokenizer files and the chat template: core copies them (mobius.chat_files)
