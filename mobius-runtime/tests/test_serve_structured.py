"""Structured output through `mobius serve` with the official ``openai`` client: the
answer parses and validates against the request's JSON schema every time (a random tiny
model, sampled with different seeds), streamed and not, and a constrained row leaves the
free rows of its batch unchanged."""

from __future__ import annotations

import json
import threading

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "vip": {"type": "boolean"},
                "pets": {
                    "type": "array",
                    "items": {"enum": ["a", "b"]},
                    "minItems": 1,
                    "maxItems": 2,
                },
            },
            "required": ["city", "pets"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "owner", "tags"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": "Describe a pet as JSON."}]


def _ask(client, seed: int, stream: bool, **extra) -> tuple[str, str]:
    out = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=400, temperature=1.0, seed=seed,
        stream=stream, response_format=FORMAT, **extra,
    )  # fmt: skip
    if not stream:
        return out.choices[0].message.content, out.choices[0].finish_reason
    chunks = list(out)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_answers_validate_twenty_times_of_twenty(server, stream):
    client = server.client()
    texts = set()
    for seed in range(20):
        text, finish = _ask(client, seed, stream)
        jsonschema.validate(json.loads(text), SCHEMA)  # raises on any invalid answer
        assert finish == "stop"
        texts.add(text)
    assert len(texts) > 10, "the seeds gave (nearly) one answer: sampling did not run"


def test_json_object_is_one_json_object(server):
    client = server.client()
    for seed in range(5):
        out = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=200, temperature=0.3, seed=seed,
            response_format={"type": "json_object"},
        )  # fmt: skip
        if out.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(out.choices[0].message.content), dict)
        else:  # an open object may run past max_tokens; what came is still its prefix
            assert out.choices[0].message.content.startswith("{")


def test_constrained_rows_leave_free_rows_unchanged(server, pipeline):
    """Four free rows and four constrained ones decoded together: each free row's text is
    generate()'s, each constrained one validates."""
    client = server.client()
    prompts = [f"Tell me about {w}." for w in ("cats", "rain", "salt", "maps")]
    want = [
        pipeline.generate(messages=[{"role": "user", "content": p}], max_new_tokens=24).text
        for p in prompts
    ]
    got: dict[str, str] = {}
    errors: list[BaseException] = []

    def free(i: int) -> None:
        try:
            out = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": prompts[i]}],
                max_tokens=24, temperature=0,
            )  # fmt: skip
            got[f"free{i}"] = out.choices[0].message.content
        except BaseException as exc:
            errors.append(exc)

    def constrained(i: int) -> None:
        try:
            got[f"json{i}"] = _ask(client, 100 + i, stream=bool(i % 2))[0]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f, args=(i,)) for i in range(4) for f in (free, constrained)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert [got[f"free{i}"] for i in range(4)] == want
    for i in range(4):
        jsonschema.validate(json.loads(got[f"json{i}"]), SCHEMA)


@pytest.mark.parametrize(
    ("form", "param"),
    [
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}},
         "response_format.json_schema"),
        ({"type": "xml"}, "response_format"),
    ],
)  # fmt: skip
def test_bad_response_formats_are_400_naming_the_field(server, form, param):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5, response_format=form
        )
    error = bad.value.body
    assert error["param"].startswith(param), error


def _nested(levels: int) -> str:
    """A JSON schema nested ``levels`` objects deep, as JSON text (the client's encoder
    would recurse too deep on it)."""
    head = '{"type":"object","required":["a"],"properties":{"a":'
    return head * levels + '{"type":"string"}' + "}}" * levels


@pytest.mark.parametrize(
    "schema",
    [_nested(3000), json.dumps({"enum": [f"v{i}" for i in range(100_000)]})],
    ids=["3000-levels-deep", "100k-enum"],
)
def test_hostile_schemas_are_refused_in_bounded_time(server, schema):
    """Schemas past the parser's or the grammar compiler's limits are a 400, not a 500
    or a stalled server."""
    import time

    import httpx

    body = (
        '{"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], '
        '"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": '
        + schema
        + "}}}"
    )
    start = time.monotonic()
    r = httpx.post(server.url + "/v1/chat/completions", content=body, timeout=60,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert time.monotonic() - start <= 30  # a bound on hostile input, not a speed figure
    assert r.status_code == 400, r.text[:300]
