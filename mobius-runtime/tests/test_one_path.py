"""One generation path: the server's text is ``Pipeline.generate``'s for the same ids.

Both run :class:`mobius_runtime.decoding.Decoding` per request, so the same ids give
the same text (a chat answer and a seeded sample too), streamed or not, alone or batched
with seven others, on every tiny package (the multimodal one has a byte-fallback
tokenizer). The text stream decodes a bounded number of ids per token, whatever the
reply's length.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from servekit import running

from mobius_runtime.decoding import FinishReason
from mobius_runtime.sampling import SamplingParams
from mobius_runtime.text import TextStream, first_stop

TEXTS = [
    "The quick brown fox jumps over the lazy dog and then",
    "Once upon a time",
    "1, 2, 3,",
    "Bonjour, je m'appelle",
    "def main():",
    "Zürich — naïve café ☕ 日本語",
    "a",
    "The capital of France is",
]
NEW = 24


def _prompts(pipeline) -> list[list[int]]:
    return [pipeline.text.encode(t) for t in TEXTS]


def _ask(client, request: dict, stream: bool) -> tuple[str, str]:
    """(text, finish_reason) of a completion (``prompt`` in ``request``) or a chat answer."""
    if "prompt" in request:
        out = client.completions.create(model="tiny", stream=stream, **request)
        if not stream:
            return out.choices[0].text, out.choices[0].finish_reason
        chunks = list(out)
        return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
    out = client.chat.completions.create(model="tiny", stream=stream, **request)
    if not stream:
        return out.choices[0].message.content, out.choices[0].finish_reason
    chunks = [c for c in out if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    return text, chunks[-1].choices[0].finish_reason


def _at_once(client, requests: list[dict], stream: bool) -> list[tuple[str, str] | None]:
    """``_ask`` for every request, each from its own thread, all at once."""
    out: list[tuple[str, str] | None] = [None] * len(requests)

    def one(i: int) -> None:
        out[i] = _ask(client, requests[i], stream)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


OPENAI_REASON = {"stop_id": "stop", "stop_string": "stop", "max_new_tokens": "length"}
SAMPLED = {"temperature": 0.8, "top_p": 0.9}


@pytest.mark.parametrize(
    "package", ["tiny_gqa_package", "tiny_attention_package", "tiny_mm_package"]
)
def test_server_text_equals_generate_text(package, request):
    """Completions of ids, chat answers and seeded samples: the server's text and finish
    reason are ``generate()``'s, one request at a time and eight at once, streamed or not."""
    from mobius_runtime import Pipeline

    pipeline = Pipeline.load(request.getfixturevalue(package), device="cpu", threads=2)
    cases = []  # (the request to the server, generate()'s answer)
    for i, ids in enumerate(_prompts(pipeline)):
        want = pipeline.generate(input_ids=ids, max_new_tokens=NEW)
        cases.append(({"prompt": ids, "max_tokens": NEW, "temperature": 0}, want))
        messages = [{"role": "user", "content": TEXTS[i]}]
        want = pipeline.generate(messages=messages, max_new_tokens=NEW, literal_special=True)
        cases.append(({"messages": messages, "max_tokens": NEW, "temperature": 0}, want))
        want = pipeline.generate(input_ids=ids, max_new_tokens=NEW, do_sample=True, seed=i,
                                 **SAMPLED)  # fmt: skip
        cases.append(({"prompt": ids, "max_tokens": NEW, "seed": i, **SAMPLED}, want))
    requests = [r for r, _ in cases]
    expected = [(w.text, OPENAI_REASON[w.stop_reason]) for _, w in cases]
    with running(pipeline) as server:
        client = server.client()
        for stream in (False, True):
            alone = [_ask(client, r, stream) for r in requests]
            assert alone == expected, (package, stream)
            for start in range(0, len(requests), 8):  # eight clients at once
                together = _at_once(client, requests[start : start + 8], stream)
                assert together == expected[start : start + 8], (package, stream, start)
        assert server.engine.peak_batch > 1  # the clients shared decode steps


class _Counting:
    """A TextSide stand-in that counts the ids each decode call is given."""

    def __init__(self, text) -> None:
        self.text = text
        self.sizes: list[int] = []

    def decode(self, ids) -> str:
        self.sizes.append(len(ids))
        return self.text.decode(ids)


def test_the_stream_decodes_a_bounded_number_of_ids_per_token(pipeline):
    rng = np.random.default_rng(0)
    ids = pipeline.text.encode(" ".join(TEXTS * 20))[1:]
    ids += rng.integers(3, 500, size=200).tolist()  # also ids that need not join up
    counting = _Counting(pipeline.text)
    stream = TextStream(counting, stops=("\n\n", "lazy dog"))
    pieces = [stream.push(int(i)) for i in ids[:400]]
    whole = pipeline.text.decode(ids[:400])
    final, rest = stream.finish()
    assert final == whole[: first_stop(whole, ("\n\n", "lazy dog"))]
    assert "".join(pieces) + rest == final
    assert stream.stopped  # "lazy dog" is in the text
    counting.sizes.pop()  # finish(): the one whole decode
    assert max(counting.sizes) <= TextStream.MAX_PENDING + 1


def test_stop_strings_in_generate(pipeline):
    """generate(stop=...) cuts where the earliest stop string begins and says so; the
    streamed pieces join to the same text."""
    ids = _prompts(pipeline)[0]
    full = pipeline.generate(input_ids=ids, max_new_tokens=30, stop_ids=()).text
    stop = full[6:9]
    assert stop and full.find(stop) == 6, "pick a stop string that first occurs at 6"
    pieces: list[str] = []
    cut = pipeline.generate(
        input_ids=ids,
        sampling=SamplingParams(max_tokens=30, stop=(stop,), stop_ids=()),
        on_token=lambda _, piece: pieces.append(piece),
    )
    assert cut.text == full[:6] == "".join(pieces)
    assert cut.stop_reason == FinishReason.STOP_STRING == "stop_string"


def test_generate_refuses_sampling_and_its_keywords_together(pipeline):
    from mobius_runtime.errors import RequestError

    with pytest.raises(RequestError, match="sampling= and max_new_tokens, seed"):
        pipeline.generate(input_ids=[2, 3], sampling=SamplingParams(), max_new_tokens=3, seed=1)


def test_generate_and_the_engine_step_through_the_one_loop(pipeline, monkeypatch):
    """Every decode step, of ``generate`` (a cohort of one) and of the engine's cohorts
    (alone and batched), is run by :func:`mobius_runtime.decoding.step_rows`, and every
    token is picked by :func:`~mobius_runtime.decoding.take_rows`: there is no second
    loop to drift from it."""
    import sys

    from mobius_runtime import batching, decoding
    from mobius_runtime.engine import Engine

    callers: list[str] = []
    takers: list[str] = []
    real_decode, real_take = batching.Batcher.decode, decoding.Decoding.take

    def decode(self, *args, **kwargs):
        callers.append(sys._getframe(1).f_code.co_name)
        return real_decode(self, *args, **kwargs)

    def take(self, *args, **kwargs):
        takers.append(sys._getframe(1).f_code.co_name)
        return real_take(self, *args, **kwargs)

    monkeypatch.setattr(batching.Batcher, "decode", decode)
    monkeypatch.setattr(decoding.Decoding, "take", take)
    prompts = _prompts(pipeline)
    alone = pipeline.generate(input_ids=[prompts[0]], max_new_tokens=6, stop_ids=())
    assert len(alone.ids) == 6 and callers == ["step_rows"] * 5
    assert takers == ["take_rows"] * 6
    callers.clear()
    takers.clear()
    engine = Engine(pipeline, max_batch=4)
    done: list[threading.Event] = []
    texts: dict[int, str] = {}
    for i, ids in enumerate(prompts[:4]):
        event = threading.Event()
        done.append(event)

        def sink(kind, data, i=i, event=event):
            if kind == "done":
                texts[i] = data.text
                event.set()

        caller = {"input_ids": np.asarray([ids], dtype=np.int64)}
        engine.submit(caller, SamplingParams(max_tokens=6, stop_ids=()), sink)
    engine.start()
    try:
        assert all(e.wait(60) for e in done)
    finally:
        engine.stop()
    assert callers and set(callers) == {"step_rows"}
    assert len(takers) == 4 * 6 and set(takers) == {"take_rows"}
    want = pipeline.generate(input_ids=[prompts[1]], max_new_tokens=6, stop_ids=()).text
    assert texts[1] == want
