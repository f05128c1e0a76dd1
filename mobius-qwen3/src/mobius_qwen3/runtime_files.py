"""Runtime files of a Qwen3 package: ``genai_config.json`` (the tokenizer comes from core).

onnxruntime-genai 0.18 runs model type ``qwen3`` as a plain decoder LLM: one
``decoder`` graph with its default port names, which are exactly this package's
(``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key`` /
``present.{i}.key``, ``logits``). qwen3_moe packages have the same ports and use the same
type. Tokenizer files and the chat template are core's business (``mobius.chat_files``
copies them for every family).
"""

from __future__ import annotations

import json
from typing import Any

from mobius.config import GENERATION_CONFIG_NAME, eos_ids, generation_eos
from mobius.records import BuildOptions, RuntimeFile
from mobius_qwen3.config import Qwen3Config


def stop_ids(config: Qwen3Config, generation_eos_ids: Any = None) -> tuple[int, ...]:
    """Every eos id the checkpoint declares: config.json's, then generation_config's."""
    return eos_ids(config.eos_token_id, generation_eos_ids)


def genai_config(config: Qwen3Config, eos: tuple[int, ...]) -> dict:
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
    model = {
        "type": "qwen3",
        "bos_token_id": config.bos_token_id if config.bos_token_id is not None else pad,
        "eos_token_id": list(eos) if len(eos) != 1 else eos[0],
        "pad_token_id": pad,
        "context_length": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "decoder": {
            "filename": "model/model.onnx",
            "hidden_size": config.hidden_size,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "num_hidden_layers": config.num_hidden_layers,
            "head_size": config.head_dim,
        },
    }
    search = {
        "do_sample": False,
        "top_k": 1,
        "max_length": config.max_position_embeddings,
        "past_present_share_buffer": False,
    }
    return {"model": model, "search": search}


def runtime_files(config: Qwen3Config, checkpoint, options: BuildOptions) -> list[RuntimeFile]:
    gen_path = checkpoint.file(GENERATION_CONFIG_NAME) if checkpoint is not None else None
    gen_eos = generation_eos(gen_path)  # a malformed file is named in a warning
    text = json.dumps(genai_config(config, stop_ids(config, gen_eos)), indent=2)
    # tokenizer files and the chat template: core copies them for every family
    return [RuntimeFile("genai_config.json", content=text.encode())]
