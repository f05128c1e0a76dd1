"""Runtime files of a Gemma 4 text package: ``genai_config.json`` (reference §10) and the
checkpoint's tokenizer files (copied when present)."""

from __future__ import annotations

import json

from mobius.records import BuildOptions, RuntimeFile
from mobius_gemma4.config import Gemma4Config

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def genai_config(config: Gemma4Config, eos: list[int]) -> dict:
    text = config.text
    common = {
        "bos_token_id": text.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": text.pad_token_id,
        "context_length": text.max_position_embeddings,
        "vocab_size": text.vocab_size,
    }
    search = {
        "do_sample": False,
        "top_k": 1,
        "max_length": text.max_position_embeddings,
        "past_present_share_buffer": False,
    }
    if config.model_type == "gemma4_text":
        model = {"type": "gemma4_text", **common, "decoder": {"filename": "model/model.onnx"}}
    else:
        decoder: dict = {"filename": "decoder/model.onnx", "hidden_size": text.hidden_size}
        embedding: dict = {"filename": "embedding/model.onnx"}
        if text.has_ple:
            decoder["inputs"] = {"per_layer_inputs": "per_layer_inputs"}
            embedding["outputs"] = {"per_layer_inputs": "per_layer_inputs"}
        model = {"type": "gemma4", **common, "decoder": decoder, "embedding": embedding}
    return {"model": model, "search": search}


def runtime_files(
    config: Gemma4Config, contract, checkpoint, options: BuildOptions
) -> list[RuntimeFile]:
    from mobius_gemma4.processors import stop_token_ids

    files: list[RuntimeFile] = []
    gen_eos = None
    gen_path = checkpoint.file("generation_config.json") if checkpoint is not None else None
    if gen_path is not None:
        try:
            gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
        except (OSError, ValueError):
            gen_eos = None
    eos = list(stop_token_ids(config, gen_eos))
    files.append(
        RuntimeFile(
            "genai_config.json", content=json.dumps(genai_config(config, eos), indent=2).encode()
        )
    )
    if checkpoint is not None:
        for name in TOKENIZER_FILES:
            path = checkpoint.file(name)
            if path is not None:
                files.append(RuntimeFile(name, source=path))
    return files
