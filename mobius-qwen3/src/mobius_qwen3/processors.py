"""Qwen3 preprocessing for the runtime: the ChatML prompt and the stop ids.

One user message in Qwen3's chat template with ``add_generation_prompt`` (thinking
left on, the template's default): ``<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>
assistant\\n``. Qwen3 has no BOS token in its prompts (the tokenizer adds none), so
``bos_token_id`` stays unset. Generation stops on every eos id config.json and generation_config.json declare.
"""

from __future__ import annotations

from mobius.config import generation_eos
from mobius.errors import MobiusError
from mobius.records import Processors
from mobius_qwen3.config import Qwen3Config
from mobius_qwen3.runtime_files import stop_ids


def format_chat_prompt(text: str, images: int = 0, audio: int = 0) -> str:
    if images or audio:
        raise MobiusError(
            "Qwen3 is a text-only model: it takes no images or audio",
            where="Qwen3 prompt",
            fix="send text only",
        )
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def processors(config: Qwen3Config) -> Processors:
    return Processors(
        format_prompt=format_chat_prompt,
        # the package's generation_config.json, attached by the runtime (mobius_processors)
        stop_token_ids=stop_ids(config, generation_eos(config.raw)),
        bos_token_id=None,
        extra={"pad_token_id": config.pad_token_id},
    )
