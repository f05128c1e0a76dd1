"""Qwen3 preprocessing for the runtime: the ChatML prompt (stop ids: :mod:`mobius.lm.runtime`).

One user message in Qwen3's chat template with ``add_generation_prompt`` (thinking
left on, the template's default): ``<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>
assistant\\n``. Qwen3 has no BOS token in its prompts (the tokenizer adds none), so
``bos_token_id`` stays unset. Generation stops on every eos id config.json and
generation_config.json declare.
"""

from __future__ import annotations

from mobius.errors import MobiusError


def format_chat_prompt(text: str, images: int = 0, audio: int = 0) -> str:
    if images or audio:
        raise MobiusError(
            "Qwen3 is a text-only model: it takes no images or audio",
            where="Qwen3 prompt",
            fix="send text only",
        )
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
