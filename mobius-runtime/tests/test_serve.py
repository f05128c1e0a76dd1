"""`mobius serve` driven by the official ``openai`` client (text: the bundled tiny Gemma 4).

The server runs in this process on 127.0.0.1 (see ``servekit``); answers are compared
with ``Pipeline.generate`` on the same loaded pipeline, greedy.
"""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from servekit import running  # noqa: E402

# token-id prompts: independent of any chat template or text normalisation
IDS = [[2, *np.random.default_rng(i).integers(7, 500, size=n).tolist()] for i, n in
       enumerate([4, 11, 23, 7, 16, 2, 30, 9])]  # fmt: skip
NEW = 12


def test_models_and_health(server):
    client = server.client()
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_completion_equals_generate(server, pipeline):
    want = pipeline.generate(prompt="The sky is", max_new_tokens=NEW)
    out = server.client().completions.create(
        model="tiny", prompt="The sky is", max_tokens=NEW, temperature=0
    )
    assert out.choices[0].text == want.text
    assert out.usage.prompt_tokens == len(want.prompt_ids)
    assert out.usage.completion_tokens == len(want.ids)
    reason = {"stop_id": "stop", "max_new_tokens": "length"}[want.stop_reason]
    assert out.choices[0].finish_reason == reason


def test_streamed_completion_concatenates_to_the_whole_text(server, pipeline):
    want = pipeline.generate(input_ids=IDS[2], max_new_tokens=40)
    stream = server.client().completions.create(
        model="tiny", prompt=IDS[2], max_tokens=40, temperature=0, stream=True
    )
    chunks = list(stream)
    assert len(chunks) >= 2  # text, then the finish chunk (text may be joined under load)
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_stop_strings_cut_the_text(server, pipeline):
    full = pipeline.generate(input_ids=IDS[6], max_new_tokens=30, stop_ids=()).text
    stop = full[5:7]
    assert stop and full.find(stop) == 5, "pick a stop string that first occurs at 5"
    client = server.client()
    out = client.completions.create(model="tiny", prompt=IDS[6], max_tokens=30, temperature=0,
                                    stop=[stop])  # fmt: skip
    assert out.choices[0].text == full[:5] and out.choices[0].finish_reason == "stop"
    stream = client.completions.create(model="tiny", prompt=IDS[6], max_tokens=30, temperature=0,
                                       stop=stop, stream=True)  # fmt: skip
    assert "".join(c.choices[0].text for c in stream) == full[:5]


def test_seeded_sampling_equals_generate(server, pipeline):
    want = pipeline.generate(input_ids=IDS[1], max_new_tokens=NEW, do_sample=True,
                             temperature=0.8, top_p=0.9, seed=7)  # fmt: skip
    out = server.client().completions.create(
        model="tiny", prompt=IDS[1], max_tokens=NEW, temperature=0.8, top_p=0.9, seed=7
    )
    assert out.choices[0].text == want.text


def test_eight_concurrent_clients_get_their_sequential_answers(server, pipeline):
    want = [pipeline.generate(input_ids=p, max_new_tokens=40).text for p in IDS]
    got: dict[int, str] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(IDS))
    steps = server.engine.steps

    def client(i: int) -> None:
        try:
            c = server.client()
            barrier.wait()
            stream = i % 2 == 1
            out = c.completions.create(
                model="tiny", prompt=IDS[i], max_tokens=40, temperature=0, stream=stream
            )
            got[i] = "".join(ch.choices[0].text for ch in out) if stream else out.choices[0].text
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(IDS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert [got[i] for i in range(len(IDS))] == want
    assert server.engine.peak_batch >= 4, "requests were not decoded together"
    tokens = sum(len(pipeline.generate(input_ids=p, max_new_tokens=40).ids) for p in IDS)
    assert server.engine.steps - steps < tokens, "one decode step per token: no batching"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 17}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": ""}, "prompt"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_completion_requests_are_400(server, body, param):
    request = {"model": "tiny", "prompt": "hi", **body}
    r = httpx.post(server.url + "/v1/completions", json=request, timeout=10)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"]


def test_openai_client_raises_typed_errors(server):
    client = server.client()
    with pytest.raises(openai.NotFoundError) as nf:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert nf.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=-1)
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model="tiny", prompt=[7] * 5000, max_tokens=2)
    assert "positions" in long.value.body["message"]
    with pytest.raises(openai.BadRequestError) as vocab:
        client.completions.create(model="tiny", prompt=[7, 100000], max_tokens=2)
    assert "vocabulary" in vocab.value.body["message"]
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and "error" in r.json()
    assert httpx.get(server.url + "/v1/nothing", timeout=10).status_code == 404


def test_api_key(pipeline):
    with running(pipeline, api_key="sesame") as srv:
        with pytest.raises(openai.AuthenticationError):
            srv.client("wrong").models.list()
        r = httpx.get(srv.url + "/v1/models", timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert srv.client("sesame").models.list().data[0].id == "tiny"
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


def test_full_queue_answers_429_at_once(pipeline):
    from mobius_runtime.sampling import SamplingParams

    # one batch slot (free: the engine is not started) and one queue place: two fit
    with running(pipeline, max_batch=1, max_queue=1, start_engine=False) as srv:
        ids = np.asarray([IDS[0]], dtype=np.int64)
        for _ in range(2):
            srv.engine.submit({"input_ids": ids}, SamplingParams(max_tokens=4), lambda *_: None)
        start = time.monotonic()
        with pytest.raises(openai.RateLimitError) as busy:
            srv.client().completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert time.monotonic() - start < 5
        assert busy.value.status_code == 429 and busy.value.body["code"] == "queue_full"


@pytest.fixture(scope="module")
def endless(pipeline):
    """A server whose requests never meet a stop id: each runs to its max_tokens."""
    with running(pipeline) as srv:
        srv.engine.stops = set()
        yield srv


def _wait_idle(engine, cancelled_before: int) -> None:
    deadline = time.monotonic() + 10
    while engine.active or engine.queued:
        assert time.monotonic() < deadline, "the disconnected request kept its slot"
        time.sleep(0.02)
    assert engine.finished["cancelled"] == cancelled_before + 1


def test_disconnect_mid_stream_frees_the_slot(endless, pipeline):
    cancelled = endless.engine.finished["cancelled"]
    body = {"model": "tiny", "prompt": IDS[0], "max_tokens": 4000, "temperature": 0,
            "stream": True}  # fmt: skip
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", endless.url + "/v1/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        seen = [line for _, line in zip(range(6), lines) if line.startswith("data:")]
        assert len(seen) >= 2
    _wait_idle(endless.engine, cancelled)
    assert httpx.get(endless.url + "/health", timeout=10).json()["active"] == 0
    out = endless.client().completions.create(model="tiny", prompt=IDS[3], max_tokens=5,
                                              temperature=0)  # fmt: skip
    want = pipeline.generate(input_ids=IDS[3], max_new_tokens=5, stop_ids=()).text
    assert out.choices[0].text == want


def test_disconnect_while_waiting_for_a_whole_answer(endless):
    cancelled = endless.engine.finished["cancelled"]
    body = {"model": "tiny", "prompt": IDS[0], "max_tokens": 4000, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(endless.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    _wait_idle(endless.engine, cancelled)


def test_context_end_stops_like_generate(endless, pipeline):
    limit = pipeline.context_length
    prompt = [2, *np.random.default_rng(9).integers(7, 500, size=limit - 7).tolist()]
    want = pipeline.generate(input_ids=prompt, max_new_tokens=20, stop_ids=())
    assert want.stop_reason == "context_length" and len(want.ids) < 20
    out = endless.client().completions.create(
        model="tiny", prompt=prompt, max_tokens=20, temperature=0
    )
    assert out.usage.completion_tokens == len(want.ids)
    assert out.choices[0].text == want.text and out.choices[0].finish_reason == "length"


def test_a_stream_cut_by_shutdown_ends_in_an_error_not_a_finish_reason():
    """The engine cancels live requests when the server stops; OpenAI has no finish_reason
    for that, so the stream carries a 503 ``shutting_down`` error object, then [DONE],
    and a waiting non-streamed request gets the same error."""
    import asyncio
    from types import SimpleNamespace

    from mobius_runtime.engine import Finished
    from mobius_runtime.serve import app as serve_app

    cancelled = Finished("partial", "cancelled", 5, 2, 1.0, 10.0)
    events: asyncio.Queue = asyncio.Queue()
    events.put_nowait(("delta", "partial", 0))
    events.put_nowait(("done", cancelled, 0))
    gone: list[object] = []
    settings = SimpleNamespace(
        engine=SimpleNamespace(cancel=gone.append),
        open={events},
        pipeline=SimpleNamespace(text=None),
    )

    async def collect() -> list[str]:
        stream = serve_app._stream(settings, ["h"], events, {"id": "x"}, True, False)
        return [part async for part in stream]

    parts = asyncio.run(collect())
    assert parts[-1] == "data: [DONE]\n\n" and gone == ["h"]
    assert '"code": "shutting_down"' in parts[-2] and "after 2 generated tokens" in parts[-2]
    assert not any('"finish_reason": "cancelled"' in p for p in parts)
    error = serve_app._shutdown_error(cancelled.completion_tokens)
    assert error.status == 503 and error.body()["error"]["type"] == "server_error"
