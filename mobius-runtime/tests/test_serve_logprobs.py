"""``logprobs`` / ``top_logprobs`` through `mobius serve` (chat and completions, streamed
and not): each chosen token's logprob equals the log-softmax of ``Pipeline.forward``'s
logits at that position (<= 1e-4), and the listed alternatives are the likeliest."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

PROMPT = [2, 17, 230, 41, 99, 5, 311]
MESSAGES = [{"role": "user", "content": "Count to five."}]


def _log_softmax(pipeline, ids: list[int]) -> np.ndarray:
    logits = pipeline.forward(input_ids=np.asarray([ids], dtype=np.int64))["logits"][0, -1]
    row = logits.astype(np.float64)
    return row - row.max() - np.log(np.exp(row - row.max()).sum())


def _check(pipeline, prompt, ids, logprobs, tops, k: int, merged: bool = False) -> None:
    assert len(logprobs) == len(ids)
    for i, (token, lp) in enumerate(zip(ids, logprobs)):
        want = _log_softmax(pipeline, prompt + ids[:i])
        assert abs(lp - want[token]) <= 1e-4, i
        best = np.sort(want)[::-1][:k]
        if merged:  # completions key alternatives by text: ids decoding alike share a key
            assert all(np.abs(best - t).min() <= 1e-4 for t in tops[i]), i
        else:
            assert np.allclose(sorted(tops[i], reverse=True), best, atol=1e-4), i


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_completion_logprobs_are_the_models(server, pipeline, temperature):
    want = pipeline.generate(input_ids=PROMPT, max_new_tokens=10, do_sample=temperature > 0,
                             seed=3, stop_ids=())  # fmt: skip
    server.engine.stops = set()
    try:
        out = server.client().completions.create(
            model="tiny", prompt=PROMPT, max_tokens=10, temperature=temperature, seed=3,
            logprobs=4,
        )  # fmt: skip
    finally:
        server.engine.stops = set(pipeline.text.processors.stop_token_ids)
    lp = out.choices[0].logprobs
    assert out.choices[0].text == want.text
    assert lp.tokens == [pipeline.text.tokenizer.decode([i], skip_special_tokens=False)
                         for i in want.ids]  # fmt: skip
    assert lp.text_offset[0] == 0 and len(lp.text_offset) == len(want.ids)
    tops = [list(t.values()) for t in lp.top_logprobs]
    _check(pipeline, PROMPT, want.ids, lp.token_logprobs, tops, 4, merged=True)
    assert all(1 <= len(t) <= 4 for t in tops)


def test_chat_logprobs_streamed_and_whole_are_the_models(server, pipeline):
    client = server.client()
    prompt = httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": MESSAGES},
                        timeout=30).json()["tokens"]  # fmt: skip
    want = pipeline.generate(messages=MESSAGES, max_new_tokens=12, literal_special=True)
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True,
                  top_logprobs=3)  # fmt: skip
    whole = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]  # fmt: skip
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole]
    _check(pipeline, prompt, want.ids, [e.logprob for e in whole],
           [[t.logprob for t in e.top_logprobs] for e in whole], 3)  # fmt: skip
    assert all(len(e.top_logprobs) == 3 for e in whole)
    assert all(bytes(e.bytes).decode("utf-8") == e.token for e in whole)


def test_without_logprobs_there_are_none(server):
    out = server.client().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3, temperature=0
    )
    assert out.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as bad:
        server.client().chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=3, top_logprobs=2
        )
    assert bad.value.body["param"] == "top_logprobs"


# ---------------------------------------------------------------- n and seed


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_with_a_seed_are_the_same_on_a_second_call(server, pipeline, stream):
    """n=3 with a seed: three answers (choice i samples with seed + i, so each equals
    generate() with that seed), prefilled once, the same on a second call."""

    def ask() -> list[str]:
        out = server.client().completions.create(
            model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=40, n=3,
            stream=stream,
        )  # fmt: skip
        if not stream:
            assert out.usage.prompt_tokens == len(PROMPT)
            return [c.text for c in sorted(out.choices, key=lambda c: c.index)]
        texts = ["", "", ""]
        for c in out:
            for choice in c.choices:
                texts[choice.index] += choice.text
        return texts

    prefills = server.engine.prefills
    first = ask()
    assert server.engine.prefills == prefills + 1, "the three choices were prefilled apart"
    assert ask() == first
    want = [pipeline.generate(input_ids=PROMPT, max_new_tokens=12, do_sample=True, seed=40 + i,
                              temperature=1.0).text for i in range(3)]  # fmt: skip
    assert first == want
    assert len(set(first)) == 3


def test_n_chat_choices_each_have_their_message(server):
    out = server.client().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, temperature=1.0, seed=1, n=2,
        logprobs=True,
    )  # fmt: skip
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage.completion_tokens == sum(len(c.logprobs.content) for c in out.choices)
