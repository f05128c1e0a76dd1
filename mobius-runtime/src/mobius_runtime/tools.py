"""Tool calls: the schema that forces a call, and the calls read back from a reply.

The tools reach the model through the package's own chat template (HF's
``apply_chat_template(tools=...)`` convention: a list of ``{"type": "function",
"function": {"name", "description", "parameters"}}``); the model answers in the format
its template taught it, which :func:`format_for` reads off the template:

- ``hermes`` (Qwen2.5 / Qwen3 and the many templates that copy them): each call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; text outside is content.
- ``json`` (Llama 3.x and templates without call markers): the reply is one JSON object
  ``{"name": ..., "parameters" | "arguments": {...}}`` (after an optional
  ``<|python_tag|>``), or a JSON list of them.

When a call is required (``tool_choice: "required"`` or a named function) the output is
constrained (:mod:`mobius_runtime.constrained`) to :func:`calls_schema`: a JSON list of
calls whose ``arguments`` follow the function's parameter schema, read back by
:func:`parse_forced`. Arguments are returned as JSON text, as OpenAI's API carries them.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"
MAX_CALLS = 4  # calls one forced reply may hold (parallel_tool_calls: false makes it 1)


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


def _call(value: Any) -> ToolCall | None:
    """A call from a parsed ``{"name": ..., "arguments" | "parameters": ...}``, else None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as JSON text already
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    text = json.dumps(args, ensure_ascii=False)
    return ToolCall(value["name"], text, "call_" + uuid.uuid4().hex[:24])


def _calls(value: Any) -> list[ToolCall] | None:
    """Calls from one parsed JSON value (an object or a list of objects), else None."""
    items = value if isinstance(value, list) else [value]
    calls = [_call(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class ToolFormat:
    """How a template's model writes its calls (see the module's docstring)."""

    name: str

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(the reply's content without its calls, or None when nothing is left; the calls).

        Text that is not a well-formed call stays content: a reply is never lost.
        """
        if self.name == "hermes":
            calls: list[ToolCall] = []
            for match in HERMES_CALL.finditer(text):
                found = _calls(_json(match.group(1)))
                if found is None:
                    return text, []
                calls.extend(found)
            if not calls:
                return text, []
            rest = HERMES_CALL.sub("", text).strip()
            return rest or None, calls
        body = text.strip()
        body = body.removeprefix(PYTHON_TAG).strip()
        found = _calls(_json(body)) if body[:1] in "{[" and body else None
        return (None, found) if found else (text, [])


def format_for(template: str | None) -> ToolFormat:
    """The call format a chat template teaches: ``hermes`` if it writes ``<tool_call>``."""
    if template is not None and "<tool_call>" in template:
        return ToolFormat("hermes")
    return ToolFormat("json")


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


def parse_forced(text: str) -> list[ToolCall]:
    """The calls of a reply constrained to :func:`calls_schema` (none if it was cut short)."""
    return _calls(_json(text)) or []
