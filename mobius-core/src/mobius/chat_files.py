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

A template is untrusted input: :func:`check_chat_template` renders it once, in
:mod:`mobius.chat_template`'s budgeted worker, on a one-message conversation, and
the build refuses one that does not compile or cannot render that in budget.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from mobius.chat_template import TEMPLATE_FILE as CHAT_TEMPLATE_FILE
from mobius.chat_template import Renderer, TemplateFailure, first_render, named_tokens
from mobius.errors import BuildError
from mobius.records import RuntimeFile

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


def _text(rf: RuntimeFile) -> str:
    data = rf.content if rf.content is not None else rf.source.read_bytes()  # type: ignore[union-attr]
    return data.decode("utf-8")


def check_chat_template(files: Sequence[RuntimeFile]) -> None:
    """Render the package's chat template (if any) once on a one-message conversation.

    Refused (:class:`~mobius.errors.BuildError`): a template that is not UTF-8, does not
    compile, or breaks its time / memory / output budget. A template that itself
    refuses that conversation (``raise_exception``) is only reported: some templates
    require a system message or alternating roles.
    """
    by_name = {rf.path: rf for rf in files}
    template = by_name.get(CHAT_TEMPLATE_FILE)
    if template is None:
        return
    where = str(template.source or CHAT_TEMPLATE_FILE)
    tokens: dict[str, str] = {}
    config = by_name.get(TOKENIZER_CONFIG_FILE)
    try:
        source = _text(template)
        if config is not None:
            tokens = named_tokens(json.loads(_text(config)))
    except (OSError, UnicodeDecodeError) as exc:
        raise BuildError(
            f"the chat template is not readable UTF-8 text: {exc}",
            where=where,
            fix="fix or remove chat_template.jinja in the checkpoint",
        ) from exc
    except ValueError:
        tokens = {}  # an unreadable tokenizer_config.json was reported where it was copied
    renderer = Renderer(source, workers=1)
    try:
        refused = first_render(renderer, tokens)
    except TemplateFailure as exc:
        raise BuildError(
            exc.message,
            where=f"{where}:{exc.line}" if exc.line else where,
            fix="fix the template (chat_template.jinja or tokenizer_config.json's "
            "chat_template) in the checkpoint, or remove it",
        ) from None
    finally:
        renderer.close()
    if refused is not None:
        log.warning("%s: the chat template refuses a one-message conversation: %s",
                    where, refused.describe())  # fmt: skip
