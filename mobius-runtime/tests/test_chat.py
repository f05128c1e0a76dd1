"""Chat: messages through the package's template, multi-turn sessions, `mobius chat`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mobius_runtime import Pipeline
from mobius_runtime.chat_session import ChatSession
from mobius_runtime.errors import RequestError

MEDIA = Path(__file__).resolve().parents[2] / "testdata" / "media"


@pytest.fixture(scope="module")
def tiny(tiny_attention_package):
    return Pipeline.load(tiny_attention_package, device="cpu")


def test_messages_and_verbatim_prompt_give_the_same_ids(tiny):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]
    text = tiny.apply_chat_template(messages)
    assert text == "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHello<turn|>\n<|turn>model\n"
    chat = tiny.generate(messages=messages, max_new_tokens=3)
    raw = tiny.generate(prompt=text, max_new_tokens=3)
    assert chat.prompt_ids == raw.prompt_ids and chat.ids == raw.ids
    assert chat.prompt_ids.count(2) == 1  # the <bos> the text holds is not doubled
    bare = tiny.generate(prompt="Hello", max_new_tokens=1)
    assert bare.prompt_ids[0] == 2 and 5 not in bare.prompt_ids  # BOS added, no chat wrapping


def test_session_prefills_only_the_new_turn_and_matches_a_fresh_generate(tiny):
    session = ChatSession(tiny, system="Be brief.", max_new_tokens=3)
    first = session.send("What is it?")
    assert session.prefilled == len(first.prompt_ids)
    second = session.send("Tell me more")
    assert session.prefilled < len(second.prompt_ids) / 2  # the first turn came from the cache
    fresh = tiny.generate(messages=session.messages[:-1], max_new_tokens=3)
    assert fresh.prompt_ids == second.prompt_ids and fresh.ids == second.ids
    session.reset()
    again = session.send("What is it?")
    assert again.ids == first.ids and session.prefilled == len(first.prompt_ids)


def test_session_with_media_turns(tiny_mm_package):
    p = Pipeline.load(tiny_mm_package, device="cpu")
    session = ChatSession(p, max_new_tokens=2)
    session.send("Look", images=[str(MEDIA / "tiny.png")])
    turn = session.send("Listen", audio=[str(MEDIA / "tiny.wav")])
    fresh = p.generate(messages=session.messages[:-1], max_new_tokens=2)
    assert fresh.prompt_ids == turn.prompt_ids and fresh.ids == turn.ids


def _mobius() -> str:
    return str(Path(sys.executable).parent / "mobius")


def test_mobius_chat_through_stdin(tiny_attention_package, tmp_path):
    script = "Hello there\n/image nope.png\n/bogus\nAgain\n/reset\nHello there\n"
    cmd = [_mobius(), "chat", str(tiny_attention_package), "--system", "Be brief."]
    cmd += ["--max-new-tokens", "3", "--stats", "--device", "cpu"]
    run = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    replies = run.stdout.splitlines()
    assert len(replies) == 3 and replies[0] == replies[2]  # /reset: same first turn again
    stats = [line for line in run.stderr.splitlines() if line.startswith("[turn prefilled")]
    prefilled = [int(line.split()[2]) for line in stats]
    assert len(prefilled) == 3 and prefilled[1] < prefilled[0] + 5 and prefilled[2] == prefilled[0]
    assert "cannot read image file nope.png" in run.stderr
    assert "unknown command /bogus" in run.stderr
    assert "(conversation reset)" in run.stderr


def test_mobius_chat_refuses_bad_options_before_loading(tmp_path):
    cmd = [_mobius(), "chat", str(tmp_path / "nope"), "--top-p", "1.5", "--sample"]
    run = subprocess.run(cmd, input="", capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "--top-p must be in (0, 1], got 1.5" in run.stderr
    assert "does not exist" not in run.stderr


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([{"role": "robot", "content": "hi"}], "messages[0].role: unknown role 'robot'"),
        (
            [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}],
            "messages[0].content[0]: unknown content part type 'video'",
        ),
        (
            [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}],
            "an image part, but this package has no image input",
        ),
        ([], "messages must be a non-empty list"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "needs a string"),
    ],
)
def test_bad_messages(tiny, messages, needle):
    with pytest.raises(RequestError) as info:
        tiny.generate(messages=messages, max_new_tokens=1)
    assert needle in str(info.value)


def test_a_template_that_raises_names_its_line(tiny):
    with pytest.raises(RequestError) as info:
        tiny.generate(messages=[{"role": "tool", "content": "42"}], max_new_tokens=1)
    text = str(info.value)
    assert "the chat template refused the messages: unknown role 'tool' (template line 8)" in text
    assert "chat_template.jinja:8" in text


def test_more_media_parts_than_the_template_renders(tmp_path):
    import shutil

    import mobius

    source = tmp_path / "ckpt"
    shutil.copytree(MEDIA.parent / "tiny-gemma4-mm", source)
    template = (source / "chat_template.jinja").read_text()
    (source / "chat_template.jinja").write_text(template.replace("{{- '<|image|>' -}}", ""))
    mobius.build(str(source), str(tmp_path / "pkg"))
    p = Pipeline.load(tmp_path / "pkg", device="cpu")
    content = [{"type": "image", "image": str(MEDIA / "tiny.png")}, {"type": "text", "text": "x"}]
    with pytest.raises(RequestError) as info:
        p.generate(messages=[{"role": "user", "content": content}], max_new_tokens=1)
    assert "1 image part(s) but the chat template rendered 0 <|image|> placeholder(s)" in str(
        info.value
    )


STRING_TEMPLATE = (
    "{% for m in messages %}{{ '<|turn>' + m['role'] + '\\n' + m['content'] + '<turn|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|turn>model\\n' }}{% endif %}"
)
"""A template that concatenates ``content`` as a string (SmolLM2's, Llama 2's do)."""


def test_text_turns_reach_a_string_template_as_strings(tmp_path):
    import shutil

    import mobius

    source = tmp_path / "ckpt"
    shutil.copytree(MEDIA.parent / "tiny-gemma4", source)
    (source / "chat_template.jinja").write_text(STRING_TEMPLATE)
    package = mobius.build(str(source), str(tmp_path / "pkg")).out
    p = Pipeline.load(package, device="cpu")
    turn = ChatSession(p, max_new_tokens=2).send("Hello")
    want = p.generate(prompt="<|turn>user\nHello<turn|>\n<|turn>model\n", max_new_tokens=2)
    assert turn.prompt_ids == want.prompt_ids
    cmd = [_mobius(), "run", str(package), "--prompt", "Hello", "--max-new-tokens", "2"]
    run = subprocess.run([*cmd, "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
