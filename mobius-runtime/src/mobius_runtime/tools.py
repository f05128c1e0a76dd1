"""Tool calls: the schema that forces a call, and the calls read back from a reply, as
it is written (for ``delta.tool_calls``) or whole.

The tools reach the model through the package's own chat template (HF's
``apply_chat_template(tools=...)`` convention: a list of ``{"type": "function",
"function": {"name", "description", "parameters"}}``); the model answers in the format
its template taught it, which :func:`format_for` reads off the template:

- ``gemma4`` (Gemma 4's templates): each call is
  ``<|tool_call>call:NAME{key:VALUE,...}<tool_call|>``, Gemma's own notation: keys bare,
  strings between ``<|"|>`` tokens, numbers / booleans / nested ``{}`` and ``[]`` as in
  JSON. Its arguments are returned as the JSON they denote.
- ``hermes`` (Qwen2.5 / Qwen3 and the many templates that copy them): each call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; text outside is content.
- ``json`` (Llama 3.x and templates without call markers): the reply is one JSON object
  ``{"name": ..., "parameters" | "arguments": {...}}`` (after an optional
  ``<|python_tag|>``), or a JSON list of them.

A template that does not render ``tools`` at all (Gemma 3's, Gemma 2's, many older
ones) would drop them silently; :func:`fold_tools` writes them into the conversation
instead (a system message describing the tools and asking for the ``json`` format, the
earlier calls and results as plain turns), as Google's function-calling guide for
Gemma 3 prompts it.

:class:`CallReader` reads a reply as it grows: content as soon as it cannot be the start
of a call, a call's id and name as soon as its name is written, then its arguments in
fragments (JSON formats: the model's own text, as it comes; ``gemma4``: the JSON when
the call closes). A whole reply is read by the same reader (:meth:`ToolFormat.parse`), so
a stream's accumulated calls equal the whole answer's.

When a call is required (``tool_choice: "required"`` or a named function) the output is
constrained (:mod:`mobius_runtime.constrained`) to :func:`calls_schema`: a JSON list of
calls whose ``arguments`` follow the function's parameter schema, read in the ``json``
format. Arguments are returned as JSON text, as OpenAI's API carries them.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PYTHON_TAG = "<|python_tag|>"
GEMMA_QUOTE = '<|"|>'
MAX_CALLS = 4  # calls one forced reply may hold (parallel_tool_calls: false makes it 1)

# where a call begins and ends, per format (json: the reply is the call)
OPENERS = {"hermes": "<tool_call>", "gemma4": "<|tool_call>call:"}
CLOSERS = {"hermes": "</tool_call>", "gemma4": "<tool_call|>"}
# a JSON call's head up to its arguments' first character: the call is announced then
JSON_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)'
)
GEMMA_HEAD = re.compile(r"\s*([^\s{}<>]+?)\s*(?=\{)")
NAMES_TOOLS = re.compile(r"\btools\b")


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Event:
    """What a growing reply added: ``content`` text, a ``call`` (its ``index``, ``id`` and
    name in ``text``), or an ``arguments`` fragment of call ``index``."""

    kind: str
    text: str
    index: int = 0
    id: str = ""


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _arguments(args: Any) -> str | None:
    """A call's arguments as JSON text of an object, else None (some models write the
    arguments as JSON text already)."""
    if isinstance(args, str):
        args = _json(args)
    return json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else None


def _calls(value: Any) -> list[tuple[str, str]] | None:
    """(name, arguments) of each call in one parsed JSON value (an object or a list of
    ``{"name": ..., "arguments" | "parameters": ...}``), else None."""
    out = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = _arguments(item.get("arguments", item.get("parameters", {})))
        if args is None:
            return None
        out.append((item["name"], args))
    return out or None


def gemma_value(text: str) -> Any:
    """The value Gemma 4's call notation ``text`` denotes (``{k:<|"|>s<|"|>,n:1}``), or
    None when it is not well formed."""
    try:
        value, end = _gemma(text, 0)
    except (IndexError, ValueError):
        return None
    return value if not text[end:].strip() else None


def _gemma(s: str, i: int) -> tuple[Any, int]:
    i = _skip(s, i)
    if s.startswith(GEMMA_QUOTE, i):
        end = s.index(GEMMA_QUOTE, i + len(GEMMA_QUOTE))
        return s[i + len(GEMMA_QUOTE) : end], end + len(GEMMA_QUOTE)
    if s[i] in "{[":
        close = "}" if s[i] == "{" else "]"
        items: list[Any] = []
        keys: list[str] = []
        i = _skip(s, i + 1)
        while s[i] != close:
            if close == "}":
                if s.startswith(GEMMA_QUOTE, i):
                    key, i = _gemma(s, i)
                else:
                    colon = s.index(":", i)
                    key, i = s[i:colon].strip(), colon
                i = _skip(s, i)
                if s[i] != ":":
                    raise ValueError("a key without a value")
                keys.append(key)
                i += 1
            value, i = _gemma(s, i)
            items.append(value)
            i = _skip(s, i)
            if s[i] == ",":
                i = _skip(s, i + 1)
            elif s[i] != close:
                raise ValueError("a missing comma")
        return (dict(zip(keys, items, strict=True)) if close == "}" else items), i + 1
    end = i
    while end < len(s) and s[end] not in ",}]":
        end += 1
    word = s[i:end].strip()
    if not word:
        raise ValueError("an empty value")
    value = _json(word)
    return (word if value is None else value), end


def _skip(s: str, i: int) -> int:
    while s[i].isspace():
        i += 1
    return i


def _json_end(text: str, start: int, depth: int = 0) -> int | None:
    """Where the JSON object or list that opens at ``start`` (or, ``depth`` > 0, that
    ``start`` is already that deep inside) ends, or None if ``text`` ends first."""
    in_string = escaped = False
    for k in range(start, len(text)):
        c = text[k]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth <= 0:
                return k + 1
    return None


@dataclass
class _Call:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class CallReader:
    """The content and calls of one reply, read as its text grows (:meth:`feed`, then
    :meth:`close` at its end): see the module's docstring."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.format = fmt.name
        self.text = ""
        self.pos = 0  # text before this is read
        self.state = "start" if fmt.name == "json" else "content"
        self.listed = False  # json: the reply is a list of calls
        self.opened = 0  # where the call being read began (its text if it is none)
        self.body = 0  # json: where the reply's JSON begins
        self.args = 0  # where the arguments being read begin
        self.calls: list[_Call] = []

    def feed(self, delta: str) -> list[Event]:
        self.text += delta
        return self._run(final=False)

    def close(self) -> list[Event]:
        return self._run(final=True)

    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(c.name, "".join(c.arguments), c.id) for c in self.calls]

    def _run(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while getattr(self, "_" + self.state)(out, final):
            pass
        return out

    def _content_event(self, out: list[Event], end: int) -> None:
        if end > self.pos:
            out.append(Event("content", self.text[self.pos : end]))
        self.pos = end

    def _start_call(self, out: list[Event], name: str) -> None:
        call = _Call(_new_id(), name)
        self.calls.append(call)
        out.append(Event("call", name, len(self.calls) - 1, call.id))

    def _args_event(self, out: list[Event], text: str) -> None:
        if text:
            self.calls[-1].arguments.append(text)
            out.append(Event("arguments", text, len(self.calls) - 1))

    # ---- states: each reads what it can and says whether the state changed

    def _content(self, out: list[Event], final: bool) -> bool:
        opener = OPENERS[self.format]
        at = self.text.find(opener, self.pos)
        if at < 0:
            end = len(self.text)
            if not final:  # keep back what may be the start of an opener
                for keep in range(min(len(opener) - 1, end - self.pos), 0, -1):
                    if opener.startswith(self.text[end - keep :]):
                        end -= keep
                        break
            self._content_event(out, end)
            return False
        self._content_event(out, at)
        self.opened = at
        self.pos = at + len(opener)
        self.state = "head"
        return True

    def _start(self, out: list[Event], final: bool) -> bool:
        rest = self.text[self.pos :].lstrip()
        if not final and len(rest) < len(PYTHON_TAG) and PYTHON_TAG.startswith(rest):
            return False  # nothing yet, or maybe the tag
        body = rest.removeprefix(PYTHON_TAG).lstrip()
        if not body:
            if final:
                self._content_event(out, len(self.text))
            return False
        self.body = len(self.text) - len(body)
        self.pos = self.body + int(body[0] == "[")
        self.listed = body[0] == "["
        self.state = "head" if body[0] in "[{" else "plain"
        return True

    def _plain(self, out: list[Event], final: bool) -> bool:
        self._content_event(out, len(self.text))
        return False

    def _head(self, out: list[Event], final: bool) -> bool:
        head = GEMMA_HEAD if self.format == "gemma4" else JSON_HEAD
        match = head.match(self.text, self.pos)
        if match is not None:
            name = match.group(1) if self.format == "gemma4" else json.loads(match.group(1))
            self._start_call(out, name)
            self.pos = self.args = match.end()
            self.state = "arguments"
            return True
        return self._whole(out, final)

    def _whole(self, out: list[Event], final: bool) -> bool:
        """A call whose head is not in the usual order: read whole when it is complete."""
        closer = CLOSERS.get(self.format)
        if closer is None:  # json: the reply is the call
            if not final:
                return False
            found = _calls(_json(self.text[self.body :]))
            found = found[len(self.calls) :] if found else None  # those read already stay
            end = len(self.text)
        else:
            at = self.text.find(closer, self.pos)
            if at < 0:
                if final:
                    self.pos = self.opened
                    self._content_event(out, len(self.text))
                return False
            body = self.text[self.pos : at]
            found = _calls(_json(body)) if self.format == "hermes" else None
            end = at + len(closer)
        if not found:  # not a call after all: the text stays content
            self.pos = self.opened
            self._content_event(out, end)
            self.state = "content" if closer else "plain"
            return closer is not None
        for name, arguments in found:
            self._start_call(out, name)
            self._args_event(out, arguments)
        self.pos = end
        self.state = "content" if closer else "plain"
        return closer is not None

    def _arguments(self, out: list[Event], final: bool) -> bool:
        closer = CLOSERS.get(self.format)
        if self.format == "gemma4":  # converted to JSON when the call closes
            at = self.text.find(closer, self.pos)
            if at < 0 and not final:
                return False
            end = len(self.text) if at < 0 else at
            args = _arguments(gemma_value(self.text[self.pos : end]))
            self._args_event(out, self.text[self.pos : end] if args is None else args)
            self.pos = end if at < 0 else at + len(closer)
            self.state = "content"
            return at >= 0
        if self.text[self.args] != "{":  # not an object: normalised when complete
            end = _value_end(self.text, self.args)
            if end is None and not final:
                return False
            end = len(self.text) if end is None else end
            raw = self.text[self.args : end]
            self._args_event(out, _arguments(_json(raw)) or raw)
            self.pos = end
            self.state = "tail"
            return True
        end = _json_end(self.text, self.args)
        if closer is not None:  # a call cut short by its closer ends there
            at = self.text.find(closer, self.pos)
            if at >= 0 and (end is None or at < end):
                end = at
        stop = len(self.text) if end is None else end
        self._args_event(out, self.text[self.pos : stop])
        self.pos = stop
        if end is None:
            return False
        self.state = "tail"
        return True

    def _tail(self, out: list[Event], final: bool) -> bool:
        """After a call's arguments: to the end of the call (and its closer)."""
        closer = CLOSERS.get(self.format)
        if closer is not None:
            at = self.text.find(closer, self.pos)
            if at < 0:
                return False
            self.pos = at + len(closer)
            self.state = "content"
            return True
        end = _json_end(self.text, self.pos, depth=1)  # the call object's own "}"
        if end is None:
            return False
        rest = self.text[end:].lstrip()
        if self.listed and rest[:1] == ",":
            self.pos = len(self.text) - len(rest) + 1
            self.state = "head"
            return True
        if self.listed and not rest and not final:
            return False
        after = len(self.text) - len(rest)
        self.pos = after + 1 if self.listed and rest[:1] == "]" else end
        self.state = "plain"  # text after a json reply's calls is content
        return True


def _value_end(text: str, start: int) -> int | None:
    """Where the JSON string or literal at ``start`` ends (None: not yet)."""
    if text[start] == '"':
        k = start + 1
        while k < len(text):
            if text[k] == "\\":
                k += 2
                continue
            if text[k] == '"':
                return k + 1
            k += 1
        return None
    match = re.compile(r"[^,}\]\s]*").match(text, start)
    end = match.end() if match else start
    return end if end < len(text) else None


@dataclass(frozen=True)
class ToolFormat:
    """How a template's model writes its calls (see the module's docstring)."""

    name: str

    def reader(self) -> CallReader:
        return CallReader(self)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(the reply's content without its calls, or None when nothing is left; the calls).

        Read by the same :class:`CallReader` as a stream. A call whose arguments are not
        a JSON object (cut short, or not JSON) leaves the whole reply as content (a
        stream has sent such a call already, as OpenAI's does).
        """
        reader = self.reader()
        events = reader.feed(text) + reader.close()
        calls = reader.tool_calls()
        if not calls or any(not isinstance(_json(c.arguments), dict) for c in calls):
            return text, []
        content = "".join(e.text for e in events if e.kind == "content").strip()
        return content or None, calls


def format_for(template: str | None) -> ToolFormat:
    """The call format a chat template teaches (``json`` when it names no call marker)."""
    if template is not None and OPENERS["gemma4"].split("call:")[0] in template:
        return ToolFormat("gemma4")
    if template is not None and OPENERS["hermes"] in template:
        return ToolFormat("hermes")
    return ToolFormat("json")


def renders_tools(template: str) -> bool:
    """Whether a chat template reads ``tools`` at all (Gemma 3's does not)."""
    return NAMES_TOOLS.search(template) is not None


def fold_tools(messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[dict]:
    """``messages`` for a template that does not render tools: the tools described in a
    system message (joined to the conversation's own first system message), earlier
    calls as the assistant's JSON text and tool results as user turns."""
    listed = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    guide = (
        "You can call these functions, each described as JSON:\n"
        f"{listed}\n"
        'To call one, reply with only a JSON object {"name": NAME, "arguments": ARGUMENTS}'
        " (several calls: a JSON list of them). Otherwise answer normally."
    )
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{out[0]['content']}\n\n{guide}"
    else:
        out.insert(0, {"role": "system", "content": guide})
    for m in out:
        calls = m.pop("tool_calls", None)
        if calls:
            written = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                       for c in calls]  # fmt: skip
            m["content"] = json.dumps(written[0] if len(written) == 1 else written)
        if m.get("role") == "tool":
            name = m.pop("name", None)
            m.pop("tool_call_id", None)
            m["role"] = "user"
            m["content"] = f"Result of {name or 'the call'}: {m.get('content') or ''}"
    return out


def calls_schema(
    tools: Sequence[dict[str, Any]], name: str | None = None, most: int = MAX_CALLS
) -> dict[str, Any]:
    """The JSON schema of a forced reply: a list of 1 to ``most`` calls (one, of ``name``,
    when named), each ``{"name": <a tool's name>, "arguments": <its parameter schema>}``."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    items = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in chosen
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "items": items[0] if len(items) == 1 else {"anyOf": items},
        "minItems": 1,
        "maxItems": 1 if name is not None else most,
    }
    return schema


FORCED = ToolFormat("json")  # how a reply constrained to calls_schema is read


def parse_forced(text: str) -> list[ToolCall]:
    """The calls of a reply constrained to :func:`calls_schema` (none if it was cut short)."""
    return FORCED.parse(text)[1]
