"""A checkpoint's chat template is untrusted: it renders in a budgeted worker process.

Before, a template could hang ``mobius run`` and a server's worker (a loop of 10^10
steps, ``10 ** (10 ** 8)`` folded at compile time with the GIL held, so ``/health``
stopped answering), build 1 GB strings and crash the process, or end in a Python
traceback. Each case here is a one-line error naming the template and its line, in
bounded time and memory, and the model answers a normal request the same afterwards.
"""

from __future__ import annotations

import resource
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

import mobius
from mobius.chat_template import TemplateFailure
from mobius.errors import BuildError, PackageError
from mobius_runtime import Pipeline
from mobius_runtime.errors import RequestError

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"

# each branch is hostile only for the message whose content names it, so the package
# loads (its template renders one "Hello" in budget) and the request itself is refused
# (doubling may meet its memory or, on a loaded machine, its time budget first)
CASES = {
    "loop": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
             "did not finish within 2 s"),
    "power": ("{{ 10 ** (10 ** 8) }}", "10 ** 100000000 is larger than 65536 bits"),
    "repeat": ("{{ 'a' * 10**9 }}", "a repetition of 1000000000 items"),
    "lipsum": ("{{ lipsum(10**6) }}", "lipsum is bounded"),
    "indent": ("{{ messages|tojson(indent=10**8) }}", "tojson's indent is over 64"),
    "format": ("{{ '{:>999999999}'.format(1) }}", "more than its 512 MiB memory budget"),
    "percent": ("{{ '%*d' % (10**9, 1) }}", "more than its 512 MiB memory budget"),
    "doubling": ("{% set ns = namespace(s='a') %}{% for i in range(40) %}"
                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
                 "the chat template broke its budget"),
    "range": ("{{ range(10**9)|list }}", "Range too big"),
    "macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    "bigint": ("{{ 10 ** 100000 }}", "10 ** 100000 is larger than 65536 bits"),
    "digits": ("{{ 7 ** 9000 }}", "Exceeds the limit (4300 digits)"),
    "zero": ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
    "output": ("{% for i in range(99999) %}{{ 'x' * 9999 }}{% endfor %}",
               "the rendered text passed 16777216 characters"),
}  # fmt: skip
HEAD = "{%- for message in messages -%}\n"
BRANCHES = "".join(
    f"{{%- {'if' if i == 0 else 'elif'} message['content'] == '{name}' -%}}{body}\n"
    for i, (name, (body, _)) in enumerate(CASES.items())
)
TAIL = (
    "{%- endif -%}\n"
    "{{- '<|turn>' ~ message['role'] ~ '\\n' ~ message['content'] ~ '<turn|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}\n"
)
HOSTILE = HEAD + BRANCHES + TAIL
LINE = {name: 2 + i for i, name in enumerate(CASES)}  # the line of each case's branch


def _checkpoint(tmp: Path, template: str) -> Path:
    source = tmp / "ckpt"
    shutil.copytree(TINY, source)
    (source / "chat_template.jinja").write_text(template)
    return source


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    mobius.build(str(_checkpoint(tmp, HOSTILE)), str(tmp / "pkg"))
    return Pipeline.load(tmp / "pkg", device="cpu", threads=2)


def _user(text):
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_template_ends_the_request_with_its_line(hostile, name):
    before = hostile.generate(messages=_user("Hello"), max_new_tokens=4)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    start = time.monotonic()
    with pytest.raises(RequestError) as info:
        hostile.generate(messages=_user(name), max_new_tokens=4)
    elapsed = time.monotonic() - start
    text = str(info.value)
    assert CASES[name][1] in text, text
    assert f"chat_template.jinja:{LINE[name]}" in text and f"(template line {LINE[name]})" in text
    assert "\n" not in info.value.what
    assert elapsed <= 5.0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown <= 512, f"this process grew {grown:.0f} MB"
    after = hostile.generate(messages=_user("Hello"), max_new_tokens=4)
    assert after.ids == before.ids


def test_a_template_that_never_answers_is_killed_in_time(hostile):
    """One C-level operation the timer signal cannot interrupt: the worker is killed."""
    chat = hostile.text.chat
    from mobius.chat_template import Renderer

    renderer = Renderer("{{ (2 ** 60000) ** 3 }}", seconds=0.5)  # each step is allowed
    start = time.monotonic()
    with pytest.raises(TemplateFailure):
        renderer.render({"messages": []})
    assert time.monotonic() - start <= 5.0
    renderer.close()
    assert chat.render(_user("Hello")).endswith("<|turn>model\n")


def test_deeply_nested_values_and_messages_that_are_no_list(hostile):
    deep: object = "x"
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RequestError, match="nested more than 64 levels deep"):
        hostile.generate(messages=[{"role": "user", "content": "Hello", "meta": deep}])
    with pytest.raises(RequestError, match="nested more than 64 levels deep"):
        hostile.apply_chat_template(_user("Hello"), extra=deep)
    for messages in (5, {"role": "user"}, None, "Hello"):
        with pytest.raises(RequestError):
            hostile.generate(messages=messages, max_new_tokens=1)


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("{{ 'a' * 10**9 }}", "cannot render one user message within its budget"),
        (
            "{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}",
            "did not finish within 2 s",
        ),
        ("{{ 10 ** (10 ** 8) }}", "larger than 65536 bits"),
        ("line one\n{% for %}", "does not compile"),
    ],
)
def test_the_build_refuses_a_template_it_cannot_render(tmp_path, template, needle):
    out = tmp_path / "pkg"
    start = time.monotonic()
    with pytest.raises(BuildError) as info:
        mobius.build(str(_checkpoint(tmp_path, template)), str(out))
    assert needle in str(info.value)
    assert "chat_template.jinja" in str(info.value)
    assert time.monotonic() - start <= 30.0  # the build itself: not the template
    assert not out.exists()  # nothing written


def test_the_build_refuses_a_hostile_default_in_a_template_list(tmp_path):
    import json

    source = _checkpoint(tmp_path, "")
    (source / "chat_template.jinja").unlink()
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "{{ messages }}"},
        {"name": "default", "template": "{{ lipsum(10**6) }}"},
    ]
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(BuildError, match="lipsum is bounded"):
        mobius.build(str(source), str(tmp_path / "pkg"))
    assert not (tmp_path / "pkg").exists()


def test_a_template_that_refuses_the_build_conversation_is_only_reported(tmp_path, caplog):
    template = "{{ raise_exception('a system message is required') }}"
    with caplog.at_level("WARNING", logger="mobius.builder"):
        mobius.build(str(_checkpoint(tmp_path, template)), str(tmp_path / "pkg"))
    assert "refuses a one-message conversation: a system message is required" in caplog.text
    pipeline = Pipeline.load(tmp_path / "pkg", device="cpu")
    with pytest.raises(RequestError, match="a system message is required"):
        pipeline.generate(messages=_user("Hello"), max_new_tokens=1)


def test_a_package_whose_template_breaks_its_budget_is_refused_at_load(tmp_path):
    """A package written by hand (the build would refuse it): loading its template fails."""
    from mobius_runtime.chat import ChatTemplate

    where = str(tmp_path / "chat_template.jinja")
    with pytest.raises(PackageError, match="cannot render one user message within its budget"):
        ChatTemplate("{{ 'a' * 10**9 }}", {}, where)
    with pytest.raises(PackageError, match=r"does not compile.*\(template line 2\)"):
        ChatTemplate("ok\n{% if %}", {}, where)


def test_the_server_stays_healthy_while_hostile_templates_render(hostile):
    pytest.importorskip("fastapi")
    from servekit import running

    def chat(content, max_tokens=4):
        body = {"model": "tiny", "messages": _user(content), "max_tokens": max_tokens,
                "temperature": 0}  # fmt: skip
        return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)

    with running(hostile) as server:
        before = chat("Hello")
        assert before.status_code == 200
        answers: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda n=n: answers.append(chat(n)))
                   for n in ("loop", "loop", "power", "format", "loop")]  # fmt: skip
        for t in threads:
            t.start()
        time.sleep(0.3)
        for _ in range(3):  # while they render, the server answers at once
            start = time.monotonic()
            health = httpx.get(server.url + "/health", timeout=5)
            assert health.status_code == 200 and time.monotonic() - start < 2.0
            time.sleep(0.2)
        for t in threads:
            t.join(60)
        assert len(answers) == 5
        for answer in answers:
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert "the chat template broke its budget" in error["message"]
        after = chat("Hello")
        assert after.json()["choices"] == before.json()["choices"]
