"""A streamed reply costs one tokenizer call per token: the context id's own text comes
from :meth:`TextSide.decode_one`'s memory, and the released pieces are unchanged."""

from __future__ import annotations

import numpy as np

from mobius_runtime.text import TextStream


class _DecodeOnly:
    """A TextSide stand-in with ``decode`` alone: the stream's old two calls per token."""

    def __init__(self, text) -> None:
        self.decode = text.decode


def test_one_tokenizer_call_per_pushed_token_once_ids_repeat(pipeline, monkeypatch):
    text = pipeline.text
    ids = text.encode("the lazy dog jumps over the quick brown fox. " * 30)[1:]
    ids += np.random.default_rng(0).integers(3, 500, size=100).tolist()
    plain = TextStream(_DecodeOnly(text))
    calls = []
    real = text.decode
    monkeypatch.setattr(text, "_single", {})
    monkeypatch.setattr(text, "decode", lambda got: calls.append(len(got)) or real(got))
    stream = TextStream(text)
    first = len(ids) // 2
    for i in ids[:first]:
        assert stream.push(int(i)) == plain.push(int(i))
    calls.clear()
    pushed = ids[first:]
    unseen = len({int(i) for i in pushed} - {int(i) for i in ids[:first]})
    for i in pushed:
        assert stream.push(int(i)) == plain.push(int(i))
    assert len(calls) <= len(pushed) + unseen < 2 * len(pushed)
    assert stream.finish() == plain.finish()


def test_decode_one_is_decode_of_one_id(pipeline):
    text = pipeline.text
    for token in [*range(0, 300, 7), 0, 7]:
        assert text.decode_one(token) == text.decode([token])
