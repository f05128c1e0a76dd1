"""The batching engine without HTTP: fallbacks, cancellation, stop strings.

The toy package's state is read by a ``Concat`` (neither Attention nor GroupQueryAttention),
so no padded layout exists: the engine must still serve concurrent requests exactly,
one cohort per request.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mobius_runtime.engine import Engine
from mobius_runtime.sampling import SamplingParams
from mobius_runtime.text import first_stop, held_back

PROMPTS = ([2, 5, 17, 13], [2, 10, 7], [2, *range(4, 16)], [2, 20, 9])  # toy vocab: 24


def _collect(engine: Engine, prompt: list[int], sampling: SamplingParams):
    done = threading.Event()
    box: dict[str, object] = {"text": ""}

    def sink(kind: str, data: object) -> None:
        if kind == "delta":
            box["text"] = str(box["text"]) + str(data)
        else:
            box[kind] = data
            done.set()

    ids = np.asarray([prompt], dtype=np.int64)
    request = engine.submit({"input_ids": ids}, sampling, sink)
    return request, box, done


def test_unbatchable_package_runs_one_cohort_per_request(single_pkg, host, caplog):
    from mobius_runtime import Pipeline

    pipeline = Pipeline.load(single_pkg, device="cpu", host=host)
    with caplog.at_level("WARNING", logger="mobius_runtime.serve"):
        engine = Engine(pipeline, max_batch=4)
    assert not engine.batcher.batches
    assert "not batched" in caplog.text and "Concat" in caplog.text
    want = [pipeline.generate(input_ids=p, max_new_tokens=6, stop_ids=()) for p in PROMPTS]
    engine.stops = set()
    runs = [_collect(engine, p, SamplingParams(max_tokens=6)) for p in PROMPTS]  # queued first
    engine.start()
    try:
        for (_, box, done), w in zip(runs, want):
            assert done.wait(30)
            finished = box["done"]
            assert finished.text == w.text == box["text"]
            assert finished.completion_tokens == 6 and finished.reason == "max_new_tokens"
    finally:
        engine.stop()
    assert engine.peak_batch == 4  # all were active in one loop, one cohort each


def test_stop_cancels_queued_requests(single_pkg, host):
    from mobius_runtime import Pipeline
    from mobius_runtime.engine import EngineStopped

    engine = Engine(Pipeline.load(single_pkg, device="cpu", host=host), max_queue=4)
    runs = [_collect(engine, p, SamplingParams(max_tokens=3)) for p in PROMPTS[:2]]
    engine.start()  # nothing can run before stop: the loop checks stopping first
    engine.stop()
    for _, box, done in runs:
        assert done.wait(10)
        assert box["done"].reason in ("cancelled", "max_new_tokens")
    with pytest.raises(EngineStopped):
        engine.submit({"input_ids": np.asarray([[2, 3]])}, SamplingParams(max_tokens=1), print)


def test_stop_string_helpers():
    assert first_stop("abc STOP def", ("STOP",)) == 4
    assert first_stop("abc", ("x", "")) is None
    assert first_stop("a-b.c", ("." , "-")) == 1  # fmt: skip
    assert held_back("hello ST", ("STOP",)) == 2  # "ST" may begin STOP
    assert held_back("hello S", ("STOP", "SIGN")) == 1
    assert held_back("hello", ("STOP",)) == 0
    assert held_back("xx</", ("</s>", "</end>")) == 2


def test_nan_logits_in_one_row_end_only_that_request(tiny_gqa_package):
    """A batched step whose row 1 is NaN: that request fails naming the decode step, the
    others go on with the same greedy ids as alone (the step-wide finiteness check and
    argmax must pick per row)."""
    from mobius_runtime import Pipeline

    pipeline = Pipeline.load(tiny_gqa_package, device="cpu")
    prompts = [[2, *np.random.default_rng(i).integers(7, 500, size=n).tolist()]
               for i, n in enumerate([6, 9, 4])]  # fmt: skip
    want = [pipeline.generate(input_ids=p, max_new_tokens=5, stop_ids=()) for p in prompts]
    engine = Engine(pipeline, max_batch=3)
    assert engine.batcher.batches
    engine.stops = set()
    decode, calls = engine.batcher.decode, []

    def poisoned(cohort, tokens):
        logits = decode(cohort, tokens)
        calls.append(len(tokens))
        if len(calls) == 2:  # the second step, all three rows in one cohort
            logits = logits.copy()
            logits[1] = np.nan
        return logits

    engine.batcher.decode = poisoned  # type: ignore[method-assign]
    runs = [_collect(engine, p, SamplingParams(max_tokens=5)) for p in prompts]  # queued first
    engine.start()
    try:
        for _, _, done in runs:
            assert done.wait(60)
    finally:
        engine.stop()
    assert calls[:2] == [3, 3]
    assert "NaN logits at generation step 2 (decode)" in str(runs[1][1]["error"])
    assert "done" not in runs[1][1]
    for i in (0, 2):
        finished = runs[i][1]["done"]
        assert finished.text == want[i].text and finished.completion_tokens == 5
