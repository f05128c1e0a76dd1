"""Chat messages → prompt text, with the checkpoint's own chat template.

The build copies the checkpoint's template into the package as
``chat_template.jinja`` (with ``tokenizer_config.json``, whose special-token names
the template reads). A package is untrusted input: the template is rendered by
:mod:`mobius.chat_template`, in a worker process with a time, memory and output
budget and bounded operations, in the environment transformers renders with. It
receives ``messages``, ``tools=None``, ``documents=None``, ``add_generation_prompt``,
the named special tokens (``bos_token`` …, and the named ``extra_special_tokens``)
and any extra keyword the caller passes. A template that breaks its budget ends the
request with a one-line error naming the template and its line; the caller's
process never runs template code.

Messages are the HF shape: ``{"role": ..., "content": str | [part, ...]}`` with
parts ``{"type": "text", "text": ...}``, ``{"type": "image", "image": path | PIL
image | array}`` and ``{"type": "audio", "audio": path | array}`` (``path`` or a
local ``url`` are accepted in place of ``image`` / ``audio``). The template sees
plain data only: a media value becomes an inert ``"<ndarray>"``-style string, as
in transformers, and media items are handed to the family's processors in the
order the parts appear.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mobius.chat_template import (
    MAX_DEPTH,
    TEMPLATE_FILE,
    Renderer,
    TemplateFailure,
    first_render,
    named_tokens,
)
from mobius.errors import PackageError
from mobius_runtime.errors import RequestError

TOKENIZER_CONFIG = "tokenizer_config.json"
ROLES = ("system", "user", "assistant", "tool")
PART_TYPES = ("text", "image", "audio")


def user_message(
    text: str, images: Sequence[Any] = (), audio: Sequence[Any] = ()
) -> dict[str, Any]:
    """One user turn as the CLI and :class:`~mobius_runtime.chat_session.ChatSession` send it:
    the media as parts before the text, or, with no media, the text as a plain string
    (many real templates, SmolLM2's and Llama 2's among them, concatenate
    ``message['content']`` as a string)."""
    if not images and not audio:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [
        *({"type": "image", "image": item} for item in images),
        *({"type": "audio", "audio": item} for item in audio),
        {"type": "text", "text": text},
    ]
    return {"role": "user", "content": parts}


@dataclass
class Conversation:
    """Checked messages: plain data for the template, and the media in order."""

    messages: list[dict[str, Any]]
    images: list[Any] = field(default_factory=list)
    audio: list[Any] = field(default_factory=list)


def _media_value(part: Mapping[str, Any], kind: str) -> Any:
    for key in (kind, "path", "url"):
        if part.get(key) is not None:
            return part[key]
    return None


def parse_messages(messages: Any, modalities: set[str]) -> Conversation:
    """Check HF-shaped ``messages``; every problem is listed in one :class:`RequestError`."""
    if isinstance(messages, Mapping) or not isinstance(messages, Sequence) or not messages:
        raise RequestError(
            "messages must be a non-empty list of {'role': ..., 'content': ...} dicts",
            where="messages",
            fix='pass e.g. [{"role": "user", "content": "Hello"}]',
        )
    problems: list[str] = []
    out = Conversation(messages=[])
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            problems.append(f"{where}: not a dict (got {type(message).__name__})")
            continue
        role = message.get("role")
        if role not in ROLES:
            problems.append(f"{where}.role: unknown role {role!r}; use one of {', '.join(ROLES)}")
        content = message.get("content")
        if isinstance(content, str) or content is None:
            out.messages.append(_plain({k: v for k, v in message.items() if v is not None}))
            continue
        if not isinstance(content, Sequence) or isinstance(content, (bytes, Mapping)):
            problems.append(f"{where}.content: a {type(content).__name__}; use a string or parts")
            continue
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind not in PART_TYPES:
                problems.append(
                    f"{at}: unknown content part type {kind!r}; use text, image or audio"
                )
            elif kind == "text" and not isinstance(part.get("text"), str):
                problems.append(f"{at}: a text part needs a string under 'text'")
            elif kind in ("image", "audio"):
                value = _media_value(part, kind)
                if kind not in modalities:
                    accepted = ", ".join(["text", *sorted(modalities)])
                    problems.append(
                        f"{at}: an {kind} part, but this package has no {kind} input "
                        f"(it accepts: {accepted})"
                    )
                elif value is None:
                    problems.append(f"{at}: an {kind} part needs a value under {kind!r}")
                elif isinstance(value, str) and value.startswith(("http://", "https://")):
                    problems.append(f"{at}: {value!r} is a URL; the runtime reads local files")
                else:
                    (out.images if kind == "image" else out.audio).append(value)
        out.messages.append(_plain({k: v for k, v in message.items() if v is not None}))
    if problems:
        raise RequestError(
            "invalid messages: " + "; ".join(problems),
            where="messages",
            fix="give each message a role (system, user, assistant, tool) and content as a "
            "string or a list of text / image / audio parts",
        )
    return out


def _plain(value: Any, depth: int = 0) -> Any:
    """What a template may see: JSON-like data; anything else becomes ``"<TypeName>"``."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if depth >= MAX_DEPTH and isinstance(value, (Mapping, list, tuple)):
        raise RequestError(
            f"a value for the chat template is nested more than {MAX_DEPTH} levels deep",
            where="messages",
            fix="pass plain messages (strings, or lists of parts)",
        )
    if isinstance(value, Mapping):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy scalars
        return _plain(value.item(), depth)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return f"<{type(value).__name__}>"


def special_tokens(root: Path) -> dict[str, str]:
    """The named special tokens of the package's ``tokenizer_config.json`` (may be empty)."""
    return named_tokens(tokenizer_config(root))


def tokenizer_config(root: Path) -> dict[str, Any]:
    """The package's ``tokenizer_config.json`` (empty when it has none)."""
    path = root / TOKENIZER_CONFIG
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PackageError(
            f"{TOKENIZER_CONFIG} in the package is not readable JSON: {exc}",
            where=str(path),
            fix="rebuild the package from a checkpoint with a valid tokenizer_config.json",
        ) from exc
    return raw if isinstance(raw, dict) else {}


class ChatTemplate:
    """A checked chat template and the special tokens it is rendered with.

    Loading compiles it in a worker (:class:`~mobius.errors.PackageError` if it does
    not compile) and renders :data:`~mobius.chat_template.SMALL_CONVERSATION` once: a
    template that cannot render one message within its budget is refused at load, not
    at every request.
    """

    def __init__(self, source: str, tokens: Mapping[str, str], where: str) -> None:
        self.source = source
        self.tokens = dict(tokens)
        self.where = where
        self._renderer = Renderer(source)
        try:
            first_render(self._renderer, self.tokens)
        except TemplateFailure as exc:
            self._renderer.close()
            raise PackageError(
                exc.message,
                where=f"{where}:{exc.line}" if exc.line else where,
                fix="fix the template in the checkpoint and rebuild the package",
            ) from None

    @classmethod
    def load(cls, root: Path) -> ChatTemplate | None:
        """The package's template, or None when it ships none."""
        path = root / TEMPLATE_FILE
        if not path.is_file():
            return None
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PackageError(
                f"{TEMPLATE_FILE} is not readable UTF-8 text: {exc}",
                where=str(path),
                fix="rebuild the package from a checkpoint with a valid chat template",
            ) from exc
        return cls(source, special_tokens(root), str(path))

    def _values(
        self, messages: Any, add_generation_prompt: bool, kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        values = {**self.tokens, **_plain(dict(kwargs))}
        return {
            **values,
            "messages": _plain(messages),
            "tools": values.pop("tools", None),
            "documents": values.pop("documents", None),
            "add_generation_prompt": bool(add_generation_prompt),
        }

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text for already-checked plain ``messages``."""
        try:
            return self._renderer.render(self._values(messages, add_generation_prompt, kwargs))
        except TemplateFailure as exc:
            at = f"{self.where}:{exc.line}" if exc.line else self.where
            if exc.kind == "budget":
                what = f"the chat template broke its budget: {exc.describe()}"
                fix = "the package's chat template is unsafe: fix it and rebuild the package"
            else:
                what = f"the chat template refused the messages: {exc.describe()}"
                fix = "change the messages to what this model's template accepts"
            raise RequestError(what, where=at, fix=fix) from None

    def close(self) -> None:
        """Stop the template's worker processes (they also stop when this process ends)."""
        self._renderer.close()
