"""Chat messages → prompt text, with the checkpoint's own chat template.

The build copies the checkpoint's template into the package as
``chat_template.jinja`` (with ``tokenizer_config.json``, whose special-token names
the template reads). It is rendered here as transformers renders it: jinja2's
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a ``{% generation %}`` block tag (rendered as its
body), ``raise_exception``, ``strftime_now``, a JSON ``tojson`` filter with
``ensure_ascii=False`` and its ``indent`` / ``separators`` / ``sort_keys``
options, a call-only ``dict`` and a ``namespace`` that refuses underscore names.
The template receives ``messages``, ``tools=None``, ``documents=None``,
``add_generation_prompt``, the named special tokens (``bos_token`` …, and the
named ``extra_special_tokens``) and any extra keyword the caller passes.

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
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mobius.errors import PackageError
from mobius_runtime.errors import RequestError

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
ROLES = ("system", "user", "assistant", "tool")
PART_TYPES = ("text", "image", "audio")
NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


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


def _plain(value: Any) -> Any:
    """What a template may see: JSON-like data; anything else becomes ``"<TypeName>"``."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy scalars
        return _plain(value.item())
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return f"<{type(value).__name__}>"


def special_tokens(root: Path) -> dict[str, str]:
    """The named special tokens of the package's ``tokenizer_config.json`` (may be empty)."""
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
    if not isinstance(raw, dict):
        return {}
    names = {k: raw.get(k) for k in NAMED_TOKENS}
    extra = raw.get("extra_special_tokens")
    if isinstance(extra, dict):
        names.update(extra)
    out: dict[str, str] = {}
    for name, value in names.items():
        if isinstance(value, dict):  # a serialized AddedToken
            value = value.get("content")
        if isinstance(value, str):
            out[str(name)] = value
    return out


def _environment() -> Any:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}…{% endgeneration %}`` renders its body (HF marks assistant text)."""

        tags = frozenset({"generation"})

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(str(message))

    def tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        from datetime import datetime

        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                TemplateNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template may not set underscore attributes ({name!r})"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def _template_line(tb: Any) -> int | None:
    """The chat template's line in a traceback (jinja2 maps template frames back to it)."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == TEMPLATE_FILE:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, tokens: Mapping[str, str], where: str) -> None:
        import jinja2

        self.source = source
        self.tokens = dict(tokens)
        self.where = where
        env = _environment()
        try:
            code = env.compile(source, filename=TEMPLATE_FILE)
            self._template = env.template_class.from_code(env, code, env.make_globals(None))
        except jinja2.TemplateSyntaxError as exc:
            raise PackageError(
                f"the chat template does not compile: {exc.message} (line {exc.lineno})",
                where=f"{where}:{exc.lineno}",
                fix="fix the template in the checkpoint and rebuild the package",
            ) from exc

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

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text for already-checked plain ``messages``."""
        import jinja2

        values = {**self.tokens, **_plain(kwargs)}
        try:
            return self._template.render(
                messages=messages,
                tools=values.pop("tools", None),
                documents=values.pop("documents", None),
                add_generation_prompt=add_generation_prompt,
                **values,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            line = _template_line(sys.exc_info()[2])
            at = f"{self.where}:{line}" if line else self.where
            detail = getattr(exc, "message", None) or str(exc)
            raise RequestError(
                f"the chat template refused the messages: {detail}"
                + (f" (template line {line})" if line else ""),
                where=at,
                fix="change the messages to what this model's template accepts",
            ) from exc
