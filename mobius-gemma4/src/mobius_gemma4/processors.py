"""Text preprocessing for Gemma 4 (reference §1.2): chat prompt layout and stop ids.

-it models: ``<bos><|turn>user\\n{text}<turn|>\\n<|turn>model\\n``; generation stops on the
config's eos ids plus ``<turn|>`` (106). Image/audio processors come with their issue.
"""

from __future__ import annotations

from mobius.records import Processors
from mobius_gemma4.config import Gemma4Config

END_OF_TURN = 106
"""``<turn|>``: ends a chat turn; a stop id for -it checkpoints."""


def format_chat_prompt(text: str, images: int = 0, audio: int = 0) -> str:
    """The -it chat layout for one user message (media placeholders arrive with their issue)."""
    return f"<bos><|turn>user\n{text}<turn|>\n<|turn>model\n"


def stop_token_ids(
    config: Gemma4Config, generation_eos: list[int] | int | None = None
) -> tuple[int, ...]:
    ids: list[int] = list(config.text.eos_token_id)
    if generation_eos is not None:
        extra = generation_eos if isinstance(generation_eos, list) else [generation_eos]
        ids += [int(i) for i in extra]
    if END_OF_TURN not in ids and config.model_type == "gemma4":
        ids.append(END_OF_TURN)
    return tuple(dict.fromkeys(ids))


def text_processors(config: Gemma4Config) -> Processors:
    generation = config.raw.get("_generation_config") if config.raw else None
    eos = generation.get("eos_token_id") if isinstance(generation, dict) else None
    return Processors(
        format_prompt=format_chat_prompt,
        stop_token_ids=stop_token_ids(config, eos),
        bos_token_id=config.text.bos_token_id,
        extra={"pad_token_id": config.text.pad_token_id},
    )
