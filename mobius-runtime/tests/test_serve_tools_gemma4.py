"""Forced tool calls in Gemma 4's own notation through `mobius serve`, with the official
``openai`` client, on the bundled tiny Gemma 4 given a template (written for these tests)
that declares the tools and writes calls as Gemma 4's templates do:
``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``.

- ``tool_choice="required"`` / a named function: the reply is constrained to that
  notation by a Lark grammar built from the parameter schemas, so it always reads back
  as calls whose arguments validate against the schema (20 of 20, streamed and not).
- Streamed, the arguments come as JSON text in fragments as the model writes them;
  the fragments add up to the whole answer's arguments.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mobius_runtime.tools import (  # noqa: E402
    GEMMA_QUOTE,
    GemmaToJson,
    SchemaError,
    ToolFormat,
    gemma_calls_grammar,
    gemma_value,
)

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"

TEMPLATE = """\
{%- macro g(v) -%}
{%- if v is string -%}<|"|>{{ v }}<|"|>
{%- elif v is mapping -%}{ {%- for k, x in v.items() -%}{{ k }}:{{ g(x) }}{{ ',' if not loop.last }}{%- endfor -%} }
{%- elif v is sequence -%}[{%- for x in v -%}{{ g(x) }}{{ ',' if not loop.last }}{%- endfor -%}]
{%- else -%}{{ v | tojson }}{%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- if tools -%}<|turn>system
{% for t in tools %}<|tool>declaration:{{ t.function.name }}{{ g(t.function.parameters) }}<tool|>{% endfor %}<turn|>
{% endif -%}
{%- for message in messages -%}
<|turn>{{ 'model' if message.role == 'assistant' else message.role }}
{% if message.tool_calls %}{% for c in message.tool_calls %}<|tool_call>call:{{ c.function.name }}{{ g(c.function.arguments) }}<tool_call|>{% endfor %}{% else %}{{ message.content }}{% endif %}<turn|>
{% endfor -%}
{%- if add_generation_prompt %}<|turn>model
{% endif -%}"""

BOOKING = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "nights": {"type": "integer", "minimum": 1, "maximum": 14},
        "price": {"type": "number"},
        "smoking": {"type": "boolean"},
        "guest": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 8},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"enum": ["quiet", "view", "pool"]},
                 "minItems": 1, "maxItems": 3},
        "note": {"type": ["string", "null"], "maxLength": 6},
    },
    "required": ["city", "unit", "nights", "guest"],
    "additionalProperties": False,
}  # fmt: skip
CLOCK = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "book", "description": "Book a room.",
                                      "parameters": BOOKING}},
    {"type": "function", "function": {"name": "get_time", "description": "The time.",
                                      "parameters": CLOCK}},
]  # fmt: skip
PARAMS = {"book": BOOKING, "get_time": CLOCK}
ASK = [{"role": "user", "content": "Book me a room in Paris."}]
RUNS = 20


MARKERS = ("<|tool_call>", "<tool_call|>", GEMMA_QUOTE)


def _markers_as_special_tokens(path: Path) -> None:
    """Give the tokenizer Gemma 4's call markers as special tokens (as Gemma 4's own
    tokenizer has them), in the places of its last three vocabulary entries."""
    tok = json.loads(path.read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    last = sorted(vocab, key=vocab.get)[-len(MARKERS) :]
    ids = [vocab.pop(t) for t in last]
    gone = set(last)

    def parts(merge):
        return merge.split(" ") if isinstance(merge, str) else merge

    tok["model"]["merges"] = [
        m for m in tok["model"]["merges"] if not gone & {*parts(m), "".join(parts(m))}
    ]
    for i, text in zip(ids, MARKERS, strict=True):
        tok["added_tokens"].append({"id": i, "content": text, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False,
                                    "special": True})  # fmt: skip
    path.write_text(json.dumps(tok), encoding="utf-8")


@pytest.fixture(scope="module", params=["spelled", "special"])
def gemma_server(request, tmp_path_factory):
    """The markers spelled by ordinary tokens (the bundled tokenizer), or each one
    special token (as in Gemma 4's): the grammar then asks for those tokens, and the
    reply's text keeps them while other special tokens are dropped."""
    if not (TINY / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4 is not present")
    pytest.importorskip("mobius_gemma4")
    from servekit import running

    import mobius
    from mobius_runtime import Pipeline

    source = tmp_path_factory.mktemp("gemma-tools") / "ckpt"
    shutil.copytree(TINY, source)
    (source / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    if request.param == "special":
        _markers_as_special_tokens(source / "tokenizer.json")
    out = source.parent / "pkg"
    mobius.build(str(source), str(out), target="cpu")
    pipeline = Pipeline.load(out, device="cpu", threads=2)
    if request.param == "special":
        added = pipeline.text.tokenizer.get_added_tokens_decoder()
        assert {t.content for t in added.values() if t.special} >= set(MARKERS)
    with running(pipeline) as srv:
        yield srv


def _ask(seed: int, **extra) -> dict:
    return dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=400, temperature=1.0,
                seed=seed, **extra)  # fmt: skip


def _valid(calls) -> list[tuple[str, str]]:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    return [(c.function.name, c.function.arguments) for c in calls]


def test_required_calls_are_written_in_gemmas_notation_and_always_validate(gemma_server):
    client = gemma_server.client()
    seen, names = set(), set()
    for seed in range(RUNS):
        out = client.chat.completions.create(**_ask(seed, tool_choice="required"))
        choice = out.choices[0]
        assert choice.message.content is None and choice.finish_reason == "tool_calls"
        got = _valid(choice.message.tool_calls)
        names.update(n for n, _ in got)
        seen.add(json.dumps(got))
    assert len(seen) > RUNS // 2, "the seeds gave the same calls: sampling did not run"
    assert names == {"book", "get_time"}


def test_the_forced_reply_is_the_notation_itself(gemma_server):
    """The model's own text (the chosen tokens' bytes) is in Gemma's notation, not a
    JSON call list."""
    client = gemma_server.client()
    named = {"type": "function", "function": {"name": "book"}}
    out = client.chat.completions.create(**_ask(3, tool_choice=named, logprobs=True))
    text = b"".join(bytes(t.bytes) for t in out.choices[0].logprobs.content).decode()
    assert text.startswith("<|tool_call>call:book{city:" + GEMMA_QUOTE), text[:60]
    assert text.endswith("<tool_call|>") and '"city"' not in text
    [(name, arguments)] = _valid(out.choices[0].message.tool_calls)
    # (a token's bytes here are its text alone: a character split over tokens is lost)
    written = gemma_value(text.removeprefix("<|tool_call>call:book").removesuffix("<tool_call|>"))
    assert name == "book" and json.loads(arguments).keys() == written.keys()


def test_streamed_gemma_arguments_come_in_fragments_that_add_up(gemma_server):
    client = gemma_server.client()
    named = {"type": "function", "function": {"name": "book"}}
    for seed in range(RUNS):
        ask = _ask(seed, tool_choice=named if seed % 2 else "required")
        whole = client.chat.completions.create(**ask).choices[0]
        entries = []
        with client.chat.completions.stream(**ask) as stream:
            for event in stream:
                if event.type == "chunk" and event.chunk.choices:
                    delta = event.chunk.choices[0].delta
                    assert not delta.content
                    entries += delta.tool_calls or []
            final = stream.get_final_completion().choices[0]
        assert final.finish_reason == whole.finish_reason == "tool_calls"
        want = _valid(whole.message.tool_calls)
        assert _valid(final.message.tool_calls) == want
        for index, (name, arguments) in enumerate(want):
            mine = [e for e in entries if e.index == index]
            assert mine[0].function.name == name and mine[0].function.arguments == ""
            fragments = [e.function.arguments for e in mine[1:]]
            assert "".join(fragments) == arguments
            if len(json.loads(arguments)) > 1:
                assert len(fragments) > 1, "a multi-field call's arguments came whole"


# ---------------------------------------------------------------- without a server


def gemma_text(value) -> str:
    """``value`` in Gemma 4's notation (as the template's macro writes it)."""
    if isinstance(value, str):
        return GEMMA_QUOTE + value + GEMMA_QUOTE
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_text(v) for v in value) + "]"
    return json.dumps(value)


texts = st.text(st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=8)
keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | texts
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
)
values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(keys, values, max_size=4), st.lists(st.integers(1, 9), min_size=1))
def test_gemma_arguments_convert_to_the_same_json_however_they_are_cut(value, sizes):
    text = gemma_text(value)
    assert gemma_value(text) == value
    conv, out, end, k = GemmaToJson(), [], 0, 0
    while end < len(text):
        end = min(len(text), end + sizes[k % len(sizes)])
        k += 1
        out.append(conv.feed(text[:end], final=False))
    out.append(conv.feed(text, final=True))
    assert "".join(out) == json.dumps(value, ensure_ascii=False)
    reply = f"<|tool_call>call:f{text}<tool_call|>"
    reader, events = ToolFormat("gemma4").reader(), []
    for i in range(0, len(reply), 3):
        events += reader.feed(reply[i : i + 3])
    events += reader.close()
    assert [(c.name, json.loads(c.arguments)) for c in reader.tool_calls()] == [("f", value)]
    assert ToolFormat("gemma4").parse(reply)[1][0].arguments == "".join(out)


def test_gemma_null_is_null_and_broken_arguments_stay_content():
    assert gemma_value("{a:null,b:[true,-1.5]}") == {"a": None, "b": [True, -1.5]}
    broken = "<|tool_call>call:f{a:" + GEMMA_QUOTE + "x" + GEMMA_QUOTE + " b:1}<tool_call|>"
    assert ToolFormat("gemma4").parse(broken) == (broken, [])


def test_schemas_the_grammar_cannot_keep_valid_are_refused():
    def grammar(params):
        return gemma_calls_grammar([{"type": "function",
                                     "function": {"name": "f", "parameters": params}}])  # fmt: skip

    assert "call:" in grammar(BOOKING)
    for bad, word in [
        ({"type": "object", "properties": {"s": {"type": "string", "pattern": "a+"}}}, "pattern"),
        ({"type": "object", "properties": {"x": {"$ref": "#/defs/x"}}}, "$ref"),
        ({"type": "object", "properties": {"x": {"type": "number", "minimum": 0}}}, "number"),
        ({"type": "object", "properties": {"x": {"enum": ["a<b"]}}}, "<"),
    ]:
        with pytest.raises(SchemaError, match=word.replace("$", r"\$")):
            grammar(bad)


def test_a_schema_that_cannot_be_followed_is_a_400(gemma_server):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": "a+"}}}}}]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as err:
        gemma_server.client().chat.completions.create(
            model="tiny", messages=ASK, tools=bad, tool_choice="required", max_tokens=4
        )
    assert err.value.body["param"] == "tools" and "pattern" in err.value.body["message"]
