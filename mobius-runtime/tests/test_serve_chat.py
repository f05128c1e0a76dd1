"""`/v1/chat/completions` with the official ``openai`` client: text, image and audio.

Answers must equal ``Pipeline.generate(messages=..., greedy)`` on the same pipeline; the
multimodal checks use the bundled tiny Gemma 4 with vision and audio encoders and the
media files under ``testdata/media``.
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from servekit import running  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY_MM = REPO / "testdata" / "tiny-gemma4-mm"
MEDIA = REPO / "testdata" / "media"
NEW = 16
CHAT = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one?"},
]


@pytest.fixture(scope="module")
def text_server(tiny_gqa_package):
    from mobius_runtime import Pipeline

    with running(Pipeline.load(tiny_gqa_package, device="cpu", threads=2)) as srv:
        yield srv


@pytest.fixture(scope="module")
def mm_server(tmp_path_factory):
    if not (TINY_MM / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4-mm is not present")
    import mobius
    from mobius_runtime import Pipeline

    out = tmp_path_factory.mktemp("tiny-mm") / "pkg"
    mobius.build(str(TINY_MM), str(out), target="cpu")
    with running(Pipeline.load(out, device="cpu", threads=2), name="tiny-mm") as srv:
        yield srv


def test_chat_equals_generate_messages(text_server):
    want = text_server.pipeline.generate(messages=CHAT, max_new_tokens=NEW)
    out = text_server.client().chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=NEW, temperature=0
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == want.text
    assert out.usage.prompt_tokens == len(want.prompt_ids)
    assert out.usage.completion_tokens == len(want.ids)


def test_streamed_chat_deltas_concatenate_to_the_same_text(text_server):
    want = text_server.pipeline.generate(messages=CHAT, max_new_tokens=NEW)
    stream = text_server.client().chat.completions.create(
        model="tiny",
        messages=CHAT,
        max_completion_tokens=NEW,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] in ("stop", "length") and set(finals[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.ids)


def test_sse_wire_format_ends_with_done(text_server):
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", text_server.url + "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1


def test_developer_role_is_the_system_message(text_server):
    as_developer = [{"role": "developer", "content": "You answer briefly."}, *CHAT[1:]]
    want = text_server.pipeline.generate(messages=CHAT, max_new_tokens=NEW).text
    out = text_server.client().chat.completions.create(
        model="tiny", messages=as_developer, max_tokens=NEW, temperature=0
    )
    assert out.choices[0].message.content == want


def _data_url(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def test_image_request(mm_server):
    image = MEDIA / "tiny.png"
    hf = [{"role": "user", "content": [{"type": "image", "image": str(image)},
                                       {"type": "text", "text": "What is this?"}]}]  # fmt: skip
    want = mm_server.pipeline.generate(messages=hf, max_new_tokens=NEW)
    parts = [
        {"type": "image_url", "image_url": {"url": _data_url(image, "image/png")}},
        {"type": "text", "text": "What is this?"},
    ]
    out = mm_server.client().chat.completions.create(
        model="tiny-mm", messages=[{"role": "user", "content": parts}], max_tokens=NEW,
        temperature=0,
    )  # fmt: skip
    assert out.choices[0].message.content == want.text
    assert out.usage.prompt_tokens == len(want.prompt_ids) > 20  # the image's soft tokens


def test_audio_request(mm_server):
    clip = MEDIA / "tiny.wav"
    hf = [{"role": "user", "content": [{"type": "audio", "audio": str(clip)},
                                       {"type": "text", "text": "Transcribe."}]}]  # fmt: skip
    want = mm_server.pipeline.generate(messages=hf, max_new_tokens=NEW)
    data = base64.b64encode(clip.read_bytes()).decode()
    parts = [
        {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
        {"type": "text", "text": "Transcribe."},
    ]
    out = mm_server.client().chat.completions.create(
        model="tiny-mm", messages=[{"role": "user", "content": parts}], max_tokens=NEW,
        temperature=0,
    )  # fmt: skip
    assert out.choices[0].message.content == want.text
    assert out.usage.prompt_tokens == len(want.prompt_ids)


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("file:///etc/passwd", "invalid_url"),
        ("http://127.0.0.1:9/cat.png", "invalid_url"),
        ("data:image/png;base64,***", "invalid_value"),
        ("data:image/png,rawtext", "invalid_value"),
    ],
    ids=["file", "http-without-flag", "bad-base64", "not-base64"],
)
def test_media_urls_that_are_not_read(mm_server, url, code):
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
    with pytest.raises(openai.BadRequestError) as bad:
        mm_server.client().chat.completions.create(
            model="tiny-mm", messages=[{"role": "user", "content": parts}], max_tokens=2
        )
    error = bad.value.body
    assert error["code"] == code and error["param"] == "messages.0.content.0.image_url.url"


def test_bad_chat_requests(mm_server, text_server):
    garbage = "data:image/png;base64," + base64.b64encode(b"not an image at all").decode()
    bad_bodies = [
        (mm_server, [{"role": "user", "content": [{"type": "image_url",
                                                   "image_url": {"url": garbage}}]}]),
        (text_server, [{"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": _data_url(MEDIA / "tiny.png", "image/png")}}]}]),
        (text_server, [{"role": "wizard", "content": "hi"}]),
        (text_server, [{"role": "user", "content": [{"type": "video", "video": "x"}]}]),
        (text_server, []),
    ]  # fmt: skip
    for server, messages in bad_bodies:
        body = {"model": "tiny-mm" if server is mm_server else "tiny", "messages": messages}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400, (messages, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"], r.text


def test_remote_image_only_with_the_flag(mm_server):
    """--allow-remote-media fetches http(s) URLs (here from a local server, so
    --allow-private-media too), size-limited."""
    import http.server
    import threading

    image = (MEDIA / "tiny.png").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(image)))
            self.end_headers()
            self.wfile.write(image)

        def log_message(self, *args) -> None:
            pass

    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{files.server_address[1]}/tiny.png"
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
    messages = [{"role": "user", "content": parts}]
    try:
        with pytest.raises(openai.BadRequestError):
            mm_server.client().chat.completions.create(
                model="tiny-mm", messages=messages, max_tokens=4, temperature=0
            )
        with running(
            mm_server.pipeline, name="tiny-mm", allow_remote_media=True, allow_private_media=True
        ) as remote:
            out = remote.client().chat.completions.create(
                model="tiny-mm", messages=messages, max_tokens=4, temperature=0
            )
        hf = [{"role": "user", "content": [{"type": "image", "image": image},
                                           {"type": "text", "text": "?"}]}]  # fmt: skip
        want = mm_server.pipeline.generate(messages=hf, max_new_tokens=4)
        assert out.choices[0].message.content == want.text
    finally:
        files.shutdown()


def test_media_and_text_requests_decoded_together(mm_server):
    """Image, audio and text requests at once on the split (embedding + decoder) package."""
    import threading

    image, clip = MEDIA / "tiny.png", MEDIA / "tiny.wav"
    cases = [
        (
            [{"type": "image", "image": str(image)}, {"type": "text", "text": "What?"}],
            [{"type": "image_url", "image_url": {"url": _data_url(image, "image/png")}},
             {"type": "text", "text": "What?"}],
        ),
        (
            [{"type": "audio", "audio": str(clip)}, {"type": "text", "text": "Say it."}],
            [{"type": "input_audio", "input_audio": {
                "data": base64.b64encode(clip.read_bytes()).decode(), "format": "wav"}},
             {"type": "text", "text": "Say it."}],
        ),
        ("Just text, please.", "Just text, please."),
        ("Another one.", "Another one."),
    ]  # fmt: skip
    want = [
        mm_server.pipeline.generate(messages=[{"role": "user", "content": hf}], max_new_tokens=24)
        for hf, _ in cases
    ]
    got: dict[int, str] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(cases))

    def ask(i: int) -> None:
        try:
            client = mm_server.client()
            barrier.wait()
            out = client.chat.completions.create(
                model="tiny-mm", messages=[{"role": "user", "content": cases[i][1]}],
                max_tokens=24, temperature=0,
            )  # fmt: skip
            got[i] = out.choices[0].message.content
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert [got[i] for i in range(len(cases))] == [w.text for w in want]
    assert mm_server.engine.peak_batch >= 2
