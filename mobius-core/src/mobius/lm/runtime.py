"""What a decoder LM package carries for runtimes: stop ids, ``genai_config.json``, processors.

onnxruntime-genai 0.18 runs a plain decoder LLM from one ``decoder`` graph with its
default port names, which are exactly those of :func:`mobius.lm.lm_ports`. Tokenizer
files and the chat template are core's business (``mobius.chat_files`` copies them for
every family), so a family only names its genai model type and its prompt layout.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mobius.config import GENERATION_CONFIG_NAME, eos_ids, generation_eos
from mobius.errors import BuildError
from mobius.lm.config import DecoderConfig
from mobius.records import Processors, RuntimeFile


def stop_ids(config: DecoderConfig, generation_eos_ids: Any = None, *extra: Any) -> tuple[int, ...]:
    """Every eos id the checkpoint declares (config.json's, then generation_config's),
    then ``extra`` ids a family adds; each once."""
    return eos_ids(config.eos_token_id, generation_eos_ids, *extra)


def genai_config(
    config: DecoderConfig, genai_type: str, eos: tuple[int, ...], filename: str = "model/model.onnx"
) -> dict[str, Any]:
    """The ``genai_config.json`` object of a one-graph decoder: ``model`` (type, token ids,
    sizes, ``decoder`` section) and a greedy ``search`` block."""
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
    model = {
        "type": genai_type,
        "bos_token_id": config.bos_token_id if config.bos_token_id is not None else pad,
        "eos_token_id": list(eos) if len(eos) != 1 else eos[0],
        "pad_token_id": pad,
        "context_length": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "decoder": {
            "filename": filename,
            "hidden_size": config.hidden_size,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "num_hidden_layers": config.num_hidden_layers,
            "head_size": config.head_dim,
        },
    }
    return {"model": model, "search": genai_search(config.max_position_embeddings)}


def genai_search(max_length: int) -> dict[str, Any]:
    """The ``search`` block of a mobius ``genai_config.json``: greedy up to ``max_length``,
    past and present in separate buffers (the packages' KV outputs are not written in
    place)."""
    return {
        "do_sample": False,
        "top_k": 1,
        "max_length": max_length,
        "past_present_share_buffer": False,
    }


def runtime_files(config: DecoderConfig, checkpoint, genai_type: str) -> list[RuntimeFile]:
    """``genai_config.json``, its stop ids read from the checkpoint's generation config
    (a malformed file is named in a warning)."""
    gen_path = checkpoint.file(GENERATION_CONFIG_NAME) if checkpoint is not None else None
    eos = stop_ids(config, generation_eos(gen_path))
    text = json.dumps(genai_config(config, genai_type, eos), indent=2)
    return [RuntimeFile("genai_config.json", content=text.encode())]


def text_processors(
    config: DecoderConfig,
    format_prompt: Callable[[str, int, int], str] | None,
    *,
    bos_token_id: int | None = None,
) -> Processors:
    """Text-only :class:`~mobius.records.Processors`; stop ids from config.json and the
    package's generation_config.json (attached to ``config.raw`` by the runtime)."""
    return Processors(
        format_prompt=format_prompt,
        stop_token_ids=stop_ids(config, generation_eos(config.raw)),
        bos_token_id=bos_token_id,
    )


def check_component(config: DecoderConfig, component: str, where: str, family: str) -> None:
    """BuildError unless ``component`` is ``model``, the one component of these packages."""
    if component != "model":
        raise BuildError(
            f"{config.model_type} has no component {component!r}",
            where=where,
            fix=f"a {family} package has one component, 'model'",
        )
