"""Shared KV buffers on GroupQueryAttention builds: detected from the graph, exact, guarded."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from mobius_runtime import Pipeline
from mobius_runtime.errors import RequestError
from mobius_runtime.feeds import to_numpy

PROMPTS = ([2, 5, 17, 33, 90, 11], [2, 100, 7], [2, *range(40, 70)])


def _step_logits(p: Pipeline, prompt: list[int], new: int, capacity: int | None):
    """Greedy ids and every step's last-position logits, driving the executor directly."""
    ex = p.executor
    values = ex.step({"input_ids": np.array([prompt])}, None, 0, capacity)
    out, ids = [], []
    past = len(prompt)
    for _ in range(new):
        logits = to_numpy(values[p.plan.logits])[0, -1]
        out.append(logits)
        ids.append(int(np.argmax(logits)))
        state = ex.next_state(values)
        values = ex.step({"input_ids": np.array([[ids[-1]]])}, state, past, capacity)
        past += 1
    return ids, np.stack(out)


def test_gqa_build_shares_and_attention_build_does_not(
    tiny_gqa_package, tiny_attention_package, caplog
):
    with caplog.at_level(logging.DEBUG, logger="mobius_runtime.kvshare"):
        assert Pipeline.load(tiny_gqa_package, device="cpu").kv_sharing == {"model": True}
        assert Pipeline.load(tiny_attention_package, device="cpu").kv_sharing == {"model": False}
    assert "sharing on for 8 state ports" in caplog.text
    assert "concat path" in caplog.text and "ai.onnx.Attention" in caplog.text
    off = Pipeline.load(tiny_gqa_package, device="cpu", kv_share=False)
    assert off.kv_sharing == {"model": False}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_shared_buffers_give_identical_ids_and_logits(tiny_gqa_package, prompt):
    shared = Pipeline.load(tiny_gqa_package, device="cpu")
    concat = Pipeline.load(tiny_gqa_package, device="cpu", kv_share=False)
    new = 24  # past the sliding window (16) of the tiny config
    ids_s, logits_s = _step_logits(shared, prompt, new, capacity=len(prompt) + new)
    ids_c, logits_c = _step_logits(concat, prompt, new, capacity=None)
    assert ids_s == ids_c
    assert np.abs(logits_s - logits_c).max() <= 1e-6
    a = shared.generate(input_ids=prompt, max_new_tokens=new, stop_ids=())
    b = concat.generate(input_ids=prompt, max_new_tokens=new, stop_ids=())
    assert a.ids == b.ids == ids_s


def test_shared_state_is_the_preallocated_buffer(tiny_gqa_package):
    p = Pipeline.load(tiny_gqa_package, device="cpu")
    values = p.executor.step({"input_ids": np.array([[2, 9, 10]])}, None, 0, 12)
    state = p.executor.next_state(values)
    key = "model.past_key_values.0.key"
    assert state[key].shape() == [1, 2, 12, 16]
    before = state[key].data_ptr()
    values = p.executor.step({"input_ids": np.array([[4]])}, state, 3, 12)
    after = p.executor.next_state(values)[key]
    assert after.data_ptr() == before  # written in place, never reallocated or copied
    assert np.any(to_numpy(after)[:, :, 3]) and not np.any(to_numpy(after)[:, :, 4:])


def test_a_step_beyond_the_buffer_is_refused(tiny_gqa_package):
    p = Pipeline.load(tiny_gqa_package, device="cpu")
    values = p.executor.step({"input_ids": np.array([[2, 9, 10]])}, None, 0, 3)
    with pytest.raises(RequestError, match="needs 4 cache positions"):
        p.executor.step({"input_ids": np.array([[4]])}, p.executor.next_state(values), 3, 3)


def test_context_length_caps_the_buffer(tiny_gqa_package):
    p = Pipeline.load(tiny_gqa_package, device="cpu")
    p.context_length = 10
    result = p.generate(input_ids=[2, 5, 6, 7], max_new_tokens=50, stop_ids=())
    assert result.stop_reason == "context_length" and len(result.ids) == 7
    ref = Pipeline.load(tiny_gqa_package, device="cpu", kv_share=False)
    ref.context_length = 10
    assert ref.generate(input_ids=[2, 5, 6, 7], max_new_tokens=50, stop_ids=()).ids == result.ids
