"""min_p, the penalties and logprobs of SamplingParams, checked against an independent
replay of the model (``Pipeline.forward`` over the prompt and the ids so far), on the
bundled tiny Gemma 4; the serving engine gives the same ids as ``generate``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mobius_runtime.engine import Engine
from mobius_runtime.sampling import SamplingParams

PROMPT = [2, 40, 41, 42, 40, 41, 43, 44]


def _last_logits(pipeline, ids: list[int]) -> np.ndarray:
    out = pipeline.forward(input_ids=np.asarray([ids], dtype=np.int64))
    return out["logits"][0, -1].astype(np.float64)


def _penalized(logits: np.ndarray, prompt: list[int], reply: list[int], p: SamplingParams):
    """The penalties as their definitions say, written out token by token."""
    out = logits.copy()
    for token in set(prompt) | set(reply):
        value = out[token]
        out[token] = value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
    for token in set(reply):
        out[token] -= p.presence_penalty + p.frequency_penalty * reply.count(token)
    return out


def _engine_ids(pipeline, prompt: list[int], params: SamplingParams) -> list[int]:
    engine = Engine(pipeline, max_batch=2)
    done, box = threading.Event(), {}
    request = engine.submit(
        {"input_ids": np.asarray([prompt], dtype=np.int64)},
        params,
        lambda kind, data: (box.setdefault(kind, data), kind != "delta" and done.set()),
    )
    engine.start()
    try:
        assert done.wait(60)
    finally:
        engine.stop()
    assert "done" in box, box
    return list(request.ids)


def test_greedy_with_penalties_picks_the_penalized_argmax(pipeline):
    params = SamplingParams(max_tokens=20, stop_ids=(), repetition_penalty=1.8,
                            presence_penalty=1.5, frequency_penalty=0.7)  # fmt: skip
    result = pipeline.generate(input_ids=PROMPT, sampling=params)
    plain = pipeline.generate(input_ids=PROMPT, max_new_tokens=20, stop_ids=())
    assert result.ids != plain.ids, "the penalties changed nothing: the test proves nothing"
    for i, token in enumerate(result.ids):
        logits = _last_logits(pipeline, PROMPT + result.ids[:i])
        want = _penalized(logits, PROMPT, result.ids[:i], params)
        assert token == int(np.argmax(want)), i
    assert _engine_ids(pipeline, PROMPT, params) == result.ids


def test_min_p_one_is_greedy_and_min_p_rows_match_the_engine(pipeline):
    sampled = SamplingParams(max_tokens=12, stop_ids=(), temperature=1.0, seed=5, min_p=1.0)
    greedy = pipeline.generate(input_ids=PROMPT, max_new_tokens=12, stop_ids=())
    assert pipeline.generate(input_ids=PROMPT, sampling=sampled).ids == greedy.ids
    loose = SamplingParams(max_tokens=12, stop_ids=(), temperature=1.5, seed=5, min_p=0.05)
    ids = pipeline.generate(input_ids=PROMPT, sampling=loose).ids
    assert _engine_ids(pipeline, PROMPT, loose) == ids
    for i, token in enumerate(ids):  # every drawn token passed the min_p cut
        logits = _last_logits(pipeline, PROMPT + ids[:i])
        assert (logits[token] - logits.max()) / 1.5 >= np.log(0.05) - 1e-6


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_logprobs_are_the_log_softmax_of_the_models_logits(pipeline, temperature):
    params = SamplingParams(max_tokens=10, stop_ids=(), temperature=temperature, seed=11,
                            logprobs=5)  # fmt: skip
    result = pipeline.generate(input_ids=PROMPT, sampling=params)
    assert [e.token for e in result.logprobs] == result.ids
    for i, entry in enumerate(result.logprobs):
        logits = _last_logits(pipeline, PROMPT + result.ids[:i])
        logsoftmax = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert abs(entry.logprob - logsoftmax[entry.token]) <= 1e-4
        best = np.argsort(-logsoftmax, kind="stable")[:5]
        assert [t for t, _ in entry.top] == best.tolist()
        assert np.allclose([lp for _, lp in entry.top], logsoftmax[best], atol=1e-4)
    assert pipeline.generate(input_ids=PROMPT, max_new_tokens=10, stop_ids=()).logprobs is None
