"""Tools through `mobius serve` with the official ``openai`` client, on the bundled tiny
Gemma 4 (in the runtime's test extra) with a tool-aware ChatML template written for
these tests (calls as ``<tool_call>{...}</tool_call>``, the format Qwen's templates teach).

- ``tool_choice="required"`` / a named function: the reply is constrained, so it is
  always a parsable call whose arguments validate against the function's parameters.
- A tool round trip (assistant ``tool_calls`` → ``tool`` message) is rendered exactly as
  HF renders it: compared with transformers' ``apply_chat_template(tools=...)`` where
  transformers is installed, and always with plain jinja2 in HF's conventions (what
  transformers does: ``trim_blocks`` / ``lstrip_blocks``, ``tojson`` with
  ``ensure_ascii=False``, tools as ``{"type": "function", "function": {...}}``, an
  assistant's ``arguments`` as a dict).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from mobius_runtime.tools import ToolFormat, calls_schema, format_for, parse_forced  # noqa: E402

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"

TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call these functions, each described as JSON:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}Call one as <tool_call>{"name": NAME, "arguments": ARGS}</tool_call>.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}{% for call in message.tool_calls %}<tool_call>{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}}</tool_call>
{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
CLOCK = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time.",
                                      "parameters": CLOCK}},
]  # fmt: skip
PARAMS = {"get_weather": WEATHER, "get_time": CLOCK}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_package(tmp_path_factory):
    if not (TINY / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4 is not present")
    pytest.importorskip("mobius_gemma4")
    import mobius

    source = tmp_path_factory.mktemp("tools") / "ckpt"
    shutil.copytree(TINY, source)
    (source / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    out = source.parent / "pkg"
    mobius.build(str(source), str(out), target="cpu")
    return out


@pytest.fixture(scope="module")
def tool_server(tool_package):
    from servekit import running

    from mobius_runtime import Pipeline

    pipeline = Pipeline.load(tool_package, device="cpu", threads=2)
    with running(pipeline) as srv:
        yield srv


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_required_tool_choice_always_gives_a_valid_call(tool_server):
    client = tool_server.client()
    seen = set()
    for seed in range(8):
        out = client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=300,
            temperature=1.0, seed=seed,
        )  # fmt: skip
        calls = out.choices[0].message.tool_calls
        assert out.choices[0].message.content is None
        assert out.choices[0].finish_reason == "tool_calls"
        _check_calls(calls)
        seen.add(json.dumps([(c.function.name, c.function.arguments) for c in calls]))
    assert len(seen) > 1, "every seed gave the same calls: sampling did not run"


def test_streamed_calls_come_in_fragments_and_add_up_to_the_whole_answer(tool_server):
    """``delta.tool_calls`` as OpenAI streams them: a call's index, id, type and name
    first, then its arguments in fragments; the openai client's own stream accumulation
    gives the calls the same seeded request answers whole."""
    client = tool_server.client()
    fragments = 0
    for seed in range(6):
        ask = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                   max_tokens=300, temperature=1.0, seed=seed)  # fmt: skip
        whole = client.chat.completions.create(**ask).choices[0]
        deltas = []
        with client.chat.completions.stream(**ask) as stream:
            for event in stream:
                if event.type == "chunk" and event.chunk.choices:
                    deltas.append(event.chunk.choices[0].delta)
            final = stream.get_final_completion().choices[0]
        entries = [t for d in deltas for t in (d.tool_calls or [])]
        assert all(not d.content for d in deltas)
        for index in {e.index for e in entries}:
            mine = [e for e in entries if e.index == index]
            assert mine[0].id.startswith("call_") and mine[0].type == "function"
            assert mine[0].function.name and mine[0].function.arguments == ""
            assert all(e.id is None and e.function.name is None for e in mine[1:])
            fragments += len(mine) - 1
        assert final.finish_reason == whole.finish_reason == "tool_calls"
        got = [(c.function.name, c.function.arguments) for c in final.message.tool_calls]
        assert got == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        _check_calls(final.message.tool_calls)
    assert fragments > 6 * 2, "the arguments came whole, not as they were written"


def test_a_named_tool_choice_calls_that_function_once(tool_server):
    client = tool_server.client()
    for seed in range(5):
        out = client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, max_tokens=300, temperature=1.0, seed=seed,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )  # fmt: skip
        calls = out.choices[0].message.tool_calls
        assert [c.function.name for c in calls] == ["get_time"]
        _check_calls(calls)


def _round_trip() -> list[dict]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}  # fmt: skip
    return [
        {"role": "system", "content": "Be brief."},
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "clear"}'},
    ]


def _hf_shaped(messages: list[dict]) -> list[dict]:
    """OpenAI messages in HF's convention: arguments as a dict, no null content."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        if "tool_calls" in m:
            m["tool_calls"] = [
                {**c, "function": {**c["function"],
                                   "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]  # fmt: skip
            m.setdefault("content", "")
        out.append(m)
    return out


def _server_ids(server, messages, tools=None) -> list[int]:
    body = {"model": "tiny", "messages": messages, **({"tools": tools} if tools else {})}
    r = httpx.post(server.url + "/tokenize", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def _ids_of(server, text: str) -> list[int]:
    r = httpx.post(server.url + "/tokenize", json={"model": "tiny", "prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_a_tool_round_trip_renders_as_jinja2_in_hf_conventions_renders_it(tool_server):
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.policies["json.dumps_kwargs"] = {"ensure_ascii": False, "sort_keys": False}
    want = env.from_string(TEMPLATE).render(
        messages=_hf_shaped(_round_trip()), tools=TOOLS, add_generation_prompt=True
    )
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"' in want
    assert "<tool_response>" in want and '"get_time"' in want
    assert _server_ids(tool_server, _round_trip(), TOOLS) == _ids_of(tool_server, want)
    # the same trip without tools renders no tool list
    plain = env.from_string(TEMPLATE).render(
        messages=_hf_shaped(_round_trip()), tools=None, add_generation_prompt=True
    )
    assert _server_ids(tool_server, _round_trip()) == _ids_of(tool_server, plain)


def test_a_tool_round_trip_renders_as_transformers_renders_it(tool_server, tool_package):
    transformers = pytest.importorskip("transformers")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tool_package / "tokenizer.json"))
    want = tok.apply_chat_template(
        _hf_shaped(_round_trip()), tools=TOOLS, chat_template=TEMPLATE, tokenize=False,
        add_generation_prompt=True,
    )  # fmt: skip
    assert _server_ids(tool_server, _round_trip(), TOOLS) == _ids_of(tool_server, want)


def test_the_next_turn_after_a_tool_message_is_answered(tool_server):
    out = tool_server.client().chat.completions.create(
        model="tiny", messages=_round_trip(), tools=TOOLS, max_tokens=8, temperature=0
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.prompt_tokens == len(_server_ids(tool_server, _round_trip(), TOOLS))


def test_tool_choice_none_keeps_the_tools_out_of_the_prompt(tool_server):
    out = tool_server.client().chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0
    )
    assert out.usage.prompt_tokens == len(_server_ids(tool_server, ASK))
    assert out.choices[0].message.tool_calls is None


def test_a_named_tool_that_is_not_in_tools_is_a_400(tool_server):
    with pytest.raises(openai.BadRequestError) as bad:
        tool_server.client().chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, max_tokens=4,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )  # fmt: skip
    assert bad.value.body["param"] == "tool_choice"


# ---------------------------------------------------------------- reading calls back


def test_hermes_calls_are_read_and_the_rest_is_content():
    fmt = format_for(TEMPLATE)
    assert fmt.name == "hermes"
    text = 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    content, calls = fmt.parse(text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"zone": "UTC"})]
    broken = '<tool_call>{"name": "get_time", "arguments": {"zone": </tool_call>'
    assert fmt.parse(broken) == (broken, [])  # not a call: the text stays content
    assert fmt.parse("no calls here") == ("no calls here", [])


def test_json_calls_are_read_as_llama_writes_them():
    fmt = format_for("{{ messages }}")
    assert fmt == ToolFormat("json")
    content, calls = fmt.parse('<|python_tag|>{"name": "f", "parameters": {"x": 1}}')
    assert content is None and [(c.name, c.arguments) for c in calls] == [("f", '{"x": 1}')]
    assert fmt.parse('{"answer": 3}') == ('{"answer": 3}', [])


def test_forced_calls_schema_and_parse():
    schema = calls_schema(TOOLS, "get_time")
    assert schema["maxItems"] == 1 and schema["items"]["properties"]["name"] == {
        "const": "get_time"
    }
    calls = parse_forced('[{"name": "get_time", "arguments": {"zone": "CET"}}]')
    assert [c.name for c in calls] == ["get_time"]
    assert parse_forced('[{"name": "get_time", "argu') == []


def _pieces(fmt: ToolFormat, text: str, sizes: list[int]):
    """``text`` fed to a reader in pieces of ``sizes`` (cycled): (content, calls)."""
    reader, events, i, k = fmt.reader(), [], 0, 0
    while i < len(text):
        events += reader.feed(text[i : i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    events += reader.close()
    content = "".join(e.text for e in events if e.kind == "content")
    return content, [(c.name, c.arguments) for c in reader.tool_calls()]


GEMMA_REPLY = (
    'Checking. <|tool_call>call:get_weather{city:<|"|>Paris, FR<|"|>,unit:<|"|>celsius'
    '<|"|>,days:3,extra:{deep:true,list:[1,<|"|>a{b}<|"|>]}}<tool_call|>'
)


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("hermes", 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "U}T"}}'
                   '\n</tool_call>\n<tool_call>{"arguments": {"zone": "CET"}, "name": '
                   '"get_time"}</tool_call> <tool'),
        ("json", '[{"name": "get_time", "arguments": {"zone": "UTC"}}, '
                 '{"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}]'),
        ("gemma4", GEMMA_REPLY),
    ],
)  # fmt: skip
def test_a_reply_read_in_any_pieces_gives_the_whole_replys_calls(fmt, text):
    whole_content, whole_calls = ToolFormat(fmt).parse(text)
    assert whole_calls
    for sizes in ([1], [2, 7], [3, 1, 11], [len(text)]):
        content, calls = _pieces(ToolFormat(fmt), text, sizes)
        assert calls == [(c.name, c.arguments) for c in whole_calls]
        assert (content.strip() or None) == whole_content


def test_gemma4_calls_are_read_in_gemmas_own_notation():
    assert format_for("... <|tool_call>call:{{ name }}{...}<tool_call|> ...").name == "gemma4"
    content, calls = ToolFormat("gemma4").parse(GEMMA_REPLY)
    assert content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris, FR", "unit": "celsius", "days": 3,
                         "extra": {"deep": True, "list": [1, "a{b}"]}})
    ]  # fmt: skip
    cut = GEMMA_REPLY[:60]  # cut short: the reply stays content
    assert ToolFormat("gemma4").parse(cut) == (cut, [])


def test_a_template_that_renders_no_tools_gets_them_in_the_conversation(server):
    """The bundled tiny Gemma 4's template (like Gemma 3's) reads no ``tools`` and refuses
    a ``tool`` role: the tools, the earlier call and its result reach the model as turns."""
    from mobius_runtime.tools import fold_tools

    trip = _hf_shaped(_round_trip())
    folded = fold_tools(trip, TOOLS)
    assert folded[0]["role"] == "system" and '"name": "get_weather"' in folded[0]["content"]
    assert folded[0]["content"].startswith("Be brief.")
    assert [m["role"] for m in folded] == ["system", "user", "assistant", "user"]
    assert json.loads(folded[2]["content"]) == {"name": "get_weather",
                                                "arguments": {"city": "Paris", "unit": "celsius"}}  # fmt: skip
    assert _server_ids(server, _round_trip(), TOOLS) == _server_ids(server, folded)
    out = server.client().chat.completions.create(
        model="tiny", messages=_round_trip(), tools=TOOLS, max_tokens=4, temperature=0
    )
    assert out.usage.prompt_tokens == len(_server_ids(server, folded))


# Gemma 4's call layout as its templates write an assistant's calls (written for this test)
GEMMA_TEMPLATE = """\
{%- macro g(v) -%}
{%- if v is string -%}<|"|>{{ v }}<|"|>
{%- elif v is mapping -%}{ {%- for k, x in v.items() -%}{{ k }}:{{ g(x) }}{{ ',' if not loop.last }}{%- endfor -%} }
{%- elif v is sequence -%}[{%- for x in v -%}{{ g(x) }}{{ ',' if not loop.last }}{%- endfor -%}]
{%- else -%}{{ v | tojson }}{%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
<|turn>{{ 'model' if message.role == 'assistant' else message.role }}
{% if message.tool_calls %}{% for c in message.tool_calls %}<|tool_call>call:{{ c.function.name }}{{ g(c.function.arguments) }}<tool_call|>{% endfor %}{% else %}{{ message.content }}{% endif %}<turn|>
{% endfor -%}"""


def test_gemma4_calls_read_back_what_a_gemma4_template_renders():
    import jinja2

    arguments = {"city": "Paris, FR", "unit": "celsius", "days": 3,
                 "extra": {"deep": False, "list": [1.5, "x"]}}  # fmt: skip
    call = {"id": "c", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}  # fmt: skip
    messages = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]}]
    text = jinja2.Environment().from_string(GEMMA_TEMPLATE).render(messages=messages)
    reply = text.split("<|turn>model\n")[1].removesuffix("<turn|>\n")
    assert reply.startswith('<|tool_call>call:get_weather{city:<|"|>Paris, FR<|"|>,unit:')
    content, calls = format_for(GEMMA_TEMPLATE).parse(reply)
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", arguments)]
    for sizes in ([1], [4, 9]):
        assert _pieces(format_for(GEMMA_TEMPLATE), reply, sizes)[1] == [
            (c.name, c.arguments) for c in calls
        ]
