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
fragments (JSON formats: the model's own text, as it comes; ``gemma4``: the JSON it
denotes, converted as it comes by :class:`GemmaToJson`). A whole reply is read by the same reader (:meth:`ToolFormat.parse`), so
a stream's accumulated calls equal the whole answer's.

When a call is required (``tool_choice: "required"`` or a named function) the output is
constrained (:mod:`mobius_runtime.constrained`) to :func:`calls_schema`: a JSON list of
calls whose ``arguments`` follow the function's parameter schema, read in the ``json``
format; a ``gemma4`` template's model is constrained to its own notation instead
(:func:`gemma_calls_grammar`, a Lark grammar built from the parameter schemas). Arguments are returned as JSON text, as OpenAI's API carries them.
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
# text that marks calls: kept in a reply's text when the tokenizer makes it a special token
CALL_MARKERS = frozenset(
    {"<|tool_call>", "<tool_call|>", GEMMA_QUOTE, "<tool_call>", "</tool_call>"}
)
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
    return _word(word), end


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
        self.converter = GemmaToJson()  # gemma4: the call being read's arguments

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
            self.converter = GemmaToJson()
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
        if self.format == "gemma4":  # converted to JSON as it is written
            at = self.text.find(closer, self.args)
            end = len(self.text) if at < 0 else at
            if at < 0 and not final:  # keep back what may begin the closer
                for keep in range(min(len(closer) - 1, end - self.args), 0, -1):
                    if closer.startswith(self.text[end - keep :]):
                        end -= keep
                        break
            self._args_event(out, self.converter.feed(self.text[self.args : end], final or at >= 0))
            self.pos = self.args + self.converter.i
            if at < 0:
                return False
            self.pos = at + len(closer)
            self.state = "content"
            return True
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


# ---------------------------------------------------------------- forced Gemma 4 calls

GEMMA_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
GEMMA_ANNOTATIONS = {"description", "title", "default", "examples", "$schema", "$comment",
                     "additionalProperties", "format", "deprecated", "readOnly", "writeOnly"}  # fmt: skip
ENUM_MOST = 256  # integer ranges up to this wide are written as their values


class SchemaError(ValueError):
    """A parameter schema the Gemma 4 call grammar cannot express (says which keyword)."""


class GemmaGrammar:
    """The Lark grammar (llguidance's dialect) of forced calls in Gemma 4's notation:
    ``<|tool_call>call:NAME{key:VALUE,...}<tool_call|>``, one to ``most`` of them, whose
    arguments, read back by :func:`gemma_value`, validate against the function's JSON
    parameter schema.

    ``specials`` maps the tokenizer's special tokens' text to their ids: a marker that is
    one special token (``<|tool_call>``, ``<tool_call|>``, ``<|"|>`` in Gemma 4's
    tokenizer) must be that token, not its spelling in other tokens.

    Covered: ``type`` (string, integer, number, boolean, null, object, array, and lists
    of them), ``enum``, ``const``, ``anyOf`` / ``oneOf``, string ``minLength`` /
    ``maxLength``, integer ``minimum`` / ``maximum`` (also exclusive), object
    ``properties`` / ``required`` (properties in the schema's order, optional ones may be
    left out; an object without ``properties`` takes any keys), array ``items`` /
    ``minItems`` / ``maxItems``. Annotations (``description``, ``format``, ...) are
    ignored; anything else (``pattern``, ``$ref``, bounds on non-integers ...) is a
    :class:`SchemaError`: the grammar could not keep the arguments valid.
    Strings cannot hold ``<`` (it could begin a marker).
    """

    def __init__(self, specials: dict[str, int]) -> None:
        self.specials = specials
        self.rules: list[str] = []
        self.count = 0

    def marker(self, text: str) -> str:
        tid = self.specials.get(text)
        return f"<[{tid}]>" if tid is not None else json.dumps(text)

    def rule(self, body: str) -> str:
        self.count += 1
        name = f"r{self.count}"
        self.rules.append(f"{name}: {body}")
        return name

    def quoted(self, body: str | None, literal: str | None = None) -> str:
        """A Gemma string: the quote marker, ``body`` (a regex) or ``literal``, the marker."""
        q = self.marker(GEMMA_QUOTE)
        inner = json.dumps(literal) if literal is not None else body
        if literal == "":
            return self.rule(f"{q} {q}")
        return self.rule(f"{q} {inner} {q}")

    def string(self, schema: dict[str, Any]) -> str:
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if high is not None and int(high) < low:
            raise SchemaError("maxLength is below minLength")
        q = self.marker(GEMMA_QUOTE)
        top = "" if high is None else str(int(high))
        if high is not None and int(high) == 0:
            return self.rule(f"{q} {q}")
        body = f"/[^<]{{{max(low, 1)},{top}}}/"
        return self.rule(f"{q} {body} {q}" + (f" | {q} {q}" if low == 0 else ""))

    def literal(self, value: Any) -> str:
        if isinstance(value, str):
            if "<" in value:
                raise SchemaError(f"the value {value!r} holds '<', which Gemma strings cannot")
            return self.quoted(None, value)
        if isinstance(value, bool) or value is None or isinstance(value, int | float):
            return self.rule(json.dumps(json.dumps(value)))
        if isinstance(value, list):
            items = [self.literal(v) for v in value]
            return self.rule(' "," '.join(['"["', *items, '"]"']) if items else '"[]"')
        if isinstance(value, dict):
            parts = []
            for k, v in value.items():
                parts.append(f'{self.key(k)} ":" {self.literal(v)}')
            return self.rule(' "," '.join(parts).join(['"{" ', ' "}"']))
        raise SchemaError(f"the value {value!r} is not JSON")

    def key(self, name: str) -> str:
        if GEMMA_KEY.match(name):
            return json.dumps(name)
        return self.literal(name)

    def integer(self, schema: dict[str, Any]) -> str:
        low, high = schema.get("minimum"), schema.get("maximum")
        if schema.get("exclusiveMinimum") is not None:
            low = max(v for v in (low, schema["exclusiveMinimum"] + 1) if v is not None)
        if schema.get("exclusiveMaximum") is not None:
            high = min(v for v in (high, schema["exclusiveMaximum"] - 1) if v is not None)
        low = None if low is None else int(-(-low // 1))
        high = None if high is None else int(high // 1)
        if low is not None and high is not None:
            if high < low:
                raise SchemaError("maximum is below minimum")
            if high - low < ENUM_MOST:
                return self.rule(" | ".join(json.dumps(str(v)) for v in range(low, high + 1)))
        if high is None and low is not None and low >= 0:
            small = [json.dumps(str(v)) for v in range(low, 10)]
            big = "/[1-9][0-9]{1,15}/"
            if low > 9:
                raise SchemaError("an integer with only a minimum above 9")
            return self.rule(" | ".join([*small, big]))
        if low is None and high is None:
            return self.rule("/-?(0|[1-9][0-9]{0,15})/")
        raise SchemaError("integer bounds other than a range, or a minimum of 0..9")

    def value(self, schema: Any) -> str:
        if schema is True or schema == {}:
            return self.any_value()
        if not isinstance(schema, dict):
            raise SchemaError(f"the schema {schema!r} is not an object")
        for word in schema:
            if word not in GEMMA_KNOWN and word not in GEMMA_ANNOTATIONS:
                raise SchemaError(f"the keyword {word!r}")
        if "const" in schema:
            return self.literal(schema["const"])
        if "enum" in schema:
            return self.rule(" | ".join(self.literal(v) for v in schema["enum"]))
        for word in ("anyOf", "oneOf"):
            if word in schema:
                rest = {k: v for k, v in schema.items() if k != word}
                return self.rule(" | ".join(self.value({**rest, **s}) for s in schema[word]))
        kind = schema.get("type")
        if isinstance(kind, list):
            return self.rule(" | ".join(self.value({**schema, "type": k}) for k in kind))
        if kind is None:
            kind = ("object" if "properties" in schema else "array" if "items" in schema
                    else None)  # fmt: skip
            if kind is None:
                return self.any_value()
        if kind == "string":
            return self.string(schema)
        if kind == "integer":
            return self.integer(schema)
        if kind == "number":
            if any(w in schema for w in NUMBER_BOUNDS):
                raise SchemaError("bounds on a number (only integers may have them)")
            return self.rule("/-?(0|[1-9][0-9]{0,15})(\\.[0-9]{1,15})?([eE][+-]?[1-9][0-9]?)?/")
        if kind == "boolean":
            return self.rule('"true" | "false"')
        if kind == "null":
            return self.rule('"null"')
        if kind == "object":
            return self.object(schema)
        if kind == "array":
            return self.array(schema)
        raise SchemaError(f"the type {kind!r}")

    def object(self, schema: dict[str, Any]) -> str:
        props = schema.get("properties")
        if props is None:
            return self.any_object()
        required = set(schema.get("required", []))
        missing = required - set(props)
        if missing:
            raise SchemaError(f"required properties without a schema: {sorted(missing)}")
        fields = [f'{self.key(k)} ":" {self.value(v)}' for k, v in props.items()]
        needs = [k in required for k in props]
        # first: properties i.. with none written yet; after: some written already (a
        # rule's name, or "" for nothing left)
        first = after = ""
        for i in range(len(fields) - 1, -1, -1):
            write_first = f"{fields[i]} {after}".strip()
            write_after = f'"," {fields[i]} {after}'.strip()
            if needs[i]:
                first, after = self.rule(write_first), self.rule(write_after)
            else:
                first = self.rule(f"{write_first} | {first}" if first else f"({write_first})?")
                after = self.rule(f"{write_after} | {after}" if after else f"({write_after})?")
        return self.rule(f'"{{" {first} "}}"'.replace("  ", " "))

    def array(self, schema: dict[str, Any]) -> str:
        item = self.value(schema.get("items", {}))
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        if high is not None and int(high) < low:
            raise SchemaError("maxItems is below minItems")
        if high is not None and int(high) == 0:
            return self.rule('"[" "]"')
        more = "*" if high is None else f"{{{max(low - 1, 0)},{int(high) - 1}}}"
        if high is None and low > 1:
            more = f"{{{low - 1},}}"
        items = self.rule(f'{item} ("," {item}){more}')
        return self.rule(f'"[" {items} "]"' + (' | "[" "]"' if low == 0 else ""))

    def any_value(self) -> str:
        if not hasattr(self, "_any"):
            self._any = "any_value"
            s = self.string({})
            num = self.value({"type": "number"})
            key = f"/[A-Za-z_][A-Za-z0-9_]{{0,30}}/ | {self.string({'minLength': 1})}"
            self.rules.append(f"any_key: {key}")
            self.rules.append(
                'any_object: "{" (any_key ":" any_value ("," any_key ":" any_value)*)? "}"'
            )
            self.rules.append('any_array: "[" (any_value ("," any_value)*)? "]"')
            self.rules.append(
                f'any_value: {s} | {num} | "true" | "false" | "null" | any_object | any_array'
            )
        return self._any

    def any_object(self) -> str:
        self.any_value()
        return "any_object"

    def calls(self, functions: Sequence[dict[str, Any]], most: int) -> str:
        opener, closer = self.marker("<|tool_call>"), self.marker("<tool_call|>")
        alts = []
        for f in functions:
            try:
                args = self.object({"type": "object", **(f.get("parameters") or {})})
            except SchemaError as exc:
                raise SchemaError(f"function {f['name']!r}: {exc}") from None
            alts.append(f'{opener} "call:" {json.dumps(f["name"])} {args} {closer}')
        call = self.rule(" | ".join(alts))
        more = f"{{0,{most - 1}}}" if most > 1 else ""
        start = f"start: {call}" + (f" ({call}){more}" if more else "")
        return "\n".join([start, *self.rules])


GEMMA_KNOWN = {"type", "enum", "const", "anyOf", "oneOf", "properties", "required", "items",
               "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum",
               "exclusiveMinimum", "exclusiveMaximum"}  # fmt: skip
NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def gemma_calls_grammar(
    tools: Sequence[dict[str, Any]],
    name: str | None = None,
    most: int = MAX_CALLS,
    specials: dict[str, int] | None = None,
) -> str:
    """The Lark grammar of a forced reply in Gemma 4's notation (see :class:`GemmaGrammar`):
    1 to ``most`` calls (one, of ``name``, when named)."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    return GemmaGrammar(specials or {}).calls(chosen, 1 if name is not None else most)


class GemmaToJson:
    """Gemma 4 call arguments (``{key:VALUE,...}``) turned into JSON text as they are
    written, so a stream can send the arguments in fragments.

    The JSON written is exactly ``json.dumps(gemma_value(whole), ensure_ascii=False)``
    (``", "`` and ``": "`` separators), so a stream's fragments add up to what the whole
    reply's call holds, however the text was cut. A piece is converted once it is
    certain: a string's characters as they come (all but a tail that may begin the
    ``<|"|>`` quote), a key once its ``:`` is written, a number or literal once the
    ``,``, ``}`` or ``]`` after it is. Text that is not well formed is passed on as it
    is from there (the arguments are then not JSON, and the reply is read as content).
    """

    def __init__(self) -> None:
        self.i = 0  # where in the arguments' text the next piece begins
        self.stack: list[list[Any]] = []  # open containers: [closer, items, expecting]
        self.state = "value"  # value, string, after, done, raw

    def feed(self, s: str, final: bool) -> str:
        """JSON for what ``s`` (the arguments' text so far; whole when ``final``) adds."""
        out: list[str] = []
        while self.i < len(s) and self._step(s, final, out):
            pass
        return "".join(out)

    def _step(self, s: str, final: bool, out: list[str]) -> bool:
        if self.state == "raw":
            out.append(s[self.i :])
            self.i = len(s)
            return False
        if self.state == "string":
            return self._string(s, final, out)
        i = self.i
        while i < len(s) and s[i].isspace():
            i += 1
        if i == len(s):
            return False
        self.i = i
        c = s[i]
        if self.state == "done":
            self.state = "raw"
            return True
        if self.state == "after":  # after an item: a comma, or the container closes
            top = self.stack[-1]
            if c == ",":
                self.i += 1
                self.state = "value"
                return True
            if c == top[0]:
                return self._close(out)
            self.state = "raw"
            return True
        top = self.stack[-1] if self.stack else None
        if top is not None and c == top[0]:  # an empty container, or a trailing comma
            return self._close(out)
        in_object = top is not None and top[0] == "}"
        if in_object and top[2] == "key":
            return self._key(s, final, out)
        if not self.stack and c != "{":  # the arguments must be an object
            self.state = "raw"
            return True
        if GEMMA_QUOTE.startswith(s[i:]) and not final:
            return False  # may be the quote
        item = top is not None and not in_object  # an array's item: its ", " first
        if s.startswith(GEMMA_QUOTE, i):
            if item:
                self._sep(out)
            out.append('"')
            self.i += len(GEMMA_QUOTE)
            self.state = "string"
            return True
        if c in "{[":
            if item:
                self._sep(out)
            out.append(c)
            self.i += 1
            self.stack.append(["}" if c == "{" else "]", 0, "key" if c == "{" else "value"])
            self._value_done(push=True)
            return True
        end = i
        while end < len(s) and s[end] not in ",}]":
            end += 1
        if end == len(s) and not final:
            return False
        word = s[i:end].strip()
        if not word:
            self.state = "raw"
            return True
        if item:
            self._sep(out)
        out.append(json.dumps(_word(word), ensure_ascii=False))
        self.i = end
        self._value_done()
        return True

    def _sep(self, out: list[str]) -> None:
        top = self.stack[-1]
        if top[1]:
            out.append(", ")
        top[1] += 1

    def _value_done(self, push: bool = False) -> None:
        if push:
            self.state = "value"
            return
        self.state = "after" if self.stack else "done"
        if self.stack and self.stack[-1][0] == "}":
            self.stack[-1][2] = "key"

    def _close(self, out: list[str]) -> bool:
        closer = self.stack.pop()[0]
        out.append(closer)
        self.i += 1
        self._value_done()
        return True

    def _key(self, s: str, final: bool, out: list[str]) -> bool:
        i = self.i
        if s.startswith(GEMMA_QUOTE, i):
            end = s.find(GEMMA_QUOTE, i + len(GEMMA_QUOTE))
            if end < 0:
                if final:
                    self.state = "raw"
                return final
            key, k = s[i + len(GEMMA_QUOTE) : end], end + len(GEMMA_QUOTE)
            while k < len(s) and s[k].isspace():
                k += 1
            if k == len(s):
                if final:
                    self.state = "raw"
                return final
            if s[k] != ":":
                self.state = "raw"
                return True
            colon = k
        elif GEMMA_QUOTE.startswith(s[i:]) and not final:
            return False
        else:
            colon = s.find(":", i)
            if colon < 0:
                if final:
                    self.state = "raw"
                return final
            key = s[i:colon].strip()
        self._sep(out)
        out.append(json.dumps(key, ensure_ascii=False) + ": ")
        self.i = colon + 1
        self.stack[-1][2] = "value"
        return True

    def _string(self, s: str, final: bool, out: list[str]) -> bool:
        end = s.find(GEMMA_QUOTE, self.i)
        if end < 0:
            stop = len(s)
            if not final:  # keep back what may begin the quote
                for keep in range(min(len(GEMMA_QUOTE) - 1, stop - self.i), 0, -1):
                    if GEMMA_QUOTE.startswith(s[stop - keep :]):
                        stop -= keep
                        break
            if stop > self.i:
                out.append(json.dumps(s[self.i : stop], ensure_ascii=False)[1:-1])
            self.i = stop
            return False
        if end > self.i:
            out.append(json.dumps(s[self.i : end], ensure_ascii=False)[1:-1])
        out.append('"')
        self.i = end + len(GEMMA_QUOTE)
        self._value_done()
        return True


def _word(word: str) -> Any:
    """A bare Gemma value: JSON's number or literal it spells, else the word as text."""
    try:
        return json.loads(word)
    except ValueError:
        return word
