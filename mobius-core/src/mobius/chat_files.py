"""The checkpoint's tokenizer files and chat template, copied into every package.

Whatever the family, a package carries the checkpoint's tokenizer files
(:data:`TOKENIZER_FILES`, each when present) so the runtime and onnxruntime-genai can
encode and decode text, stop on generation_config's eos ids, and render chats.

A chat model's prompt layout belongs to its checkpoint, not to the family plugin:
HF reads it from ``chat_template.jinja`` or, in older checkpoints, from
``tokenizer_config.json["chat_template"]`` (a string, or a list of named templates
of which ``default`` is the one used). The build writes it to the package as
``chat_template.jinja``, with ``tokenizer_config.json`` beside it (the special
token names the template refers to: ``bos_token`` …), unless the family plugin
already ships files of those names. The runtime renders it (``docs/internals.md``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from mobius.records import RuntimeFile

CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)
"""Copied as they are when the checkpoint has them (``tokenizer_config.json`` too, below)."""

log = logging.getLogger("mobius.builder")


def _from_tokenizer_config(raw: Any, where: str) -> str | None:
    """The template text of ``tokenizer_config.json["chat_template"]``, if usable."""
    template = raw.get("chat_template") if isinstance(raw, dict) else None
    if isinstance(template, str) and template.strip():
        return template
    if isinstance(template, list):
        named = {
            t.get("name"): t.get("template")
            for t in template
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
        if isinstance(named.get("default"), str):
            return named["default"]
        log.warning("%s: chat_template lists no template named 'default'; none copied", where)
    elif template is not None:
        log.warning("%s: chat_template is not a string; none copied", where)
    return None


def chat_files(checkpoint: Any, plugin_files: Sequence[RuntimeFile]) -> list[RuntimeFile]:
    """The checkpoint's tokenizer files and chat template, beside the plugin's own files.

    A file the plugin already ships under the same name is the plugin's to give.
    """
    taken = {rf.path for rf in plugin_files}
    out: list[RuntimeFile] = []
    for name in TOKENIZER_FILES:
        path = checkpoint.file(name)
        if path is not None and name not in taken:
            out.append(RuntimeFile(name, source=path))
    config_path = checkpoint.file(TOKENIZER_CONFIG_FILE)
    if config_path is not None and TOKENIZER_CONFIG_FILE not in taken:
        out.append(RuntimeFile(TOKENIZER_CONFIG_FILE, source=config_path))
    if CHAT_TEMPLATE_FILE in taken:
        return out
    jinja = checkpoint.file(CHAT_TEMPLATE_FILE)
    if jinja is not None:
        out.append(RuntimeFile(CHAT_TEMPLATE_FILE, source=jinja))
        return out
    if config_path is not None:
        try:
            raw = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("%s is not readable JSON (%s); no chat template copied", config_path, exc)
            return out
        template = _from_tokenizer_config(raw, str(config_path))
        if template is not None:
            out.append(RuntimeFile(CHAT_TEMPLATE_FILE, content=template.encode("utf-8")))
    return out
