"""The prefix cache across requests: a prompt that begins like a recent one reuses its
KV rows and gives the same ids as without the cache (greedy and seeded, on the shared
in-place GQA buffers and on ONNX Attention's concat path), says how many prompt ids it
reused (``usage.prompt_tokens_details.cached_tokens``), and stays within its budget."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mobius_runtime.engine import Engine
from mobius_runtime.kvshare import SEQ_AXIS
from mobius_runtime.prefix_cache import MIN_SHARED, PrefixCache
from mobius_runtime.sampling import SamplingParams

BASE = [2, *np.random.default_rng(7).integers(7, 500, size=48).tolist()]
PROMPTS = [[*BASE, 11, 12, 13], [*BASE, 14, 15], [*BASE[:30], 99, 98, 97], [*BASE, 11, 12, 13],
           [*BASE[:3], 5, 6]]  # fmt: skip
# ids reused from the kept prompts: none; BASE (49 ids); BASE[:30]; all but the last id;
# 3 < MIN_SHARED: none
CACHED = [0, len(BASE), 30, len(PROMPTS[0]) - 1, 0]


def _run(pipeline, cache_mb: float, sampling: SamplingParams):
    engine = Engine(pipeline, max_batch=4, prefix_cache_mb=cache_mb)
    engine.stops = set()
    engine.start()
    out = []
    try:
        for prompt in PROMPTS:  # one after the other: each may reuse the ones before
            done, box = threading.Event(), {}

            def sink(kind, data, box=box, done=done):
                if kind in ("done", "error"):
                    box[kind] = data
                    done.set()

            request = engine.submit({"input_ids": np.asarray([prompt])}, sampling, sink)
            assert done.wait(60) and "done" in box, box
            out.append((list(request.ids), box["done"].cached_tokens))
    finally:
        engine.stop()
    return out, engine.cache


@pytest.fixture(scope="module", params=["gqa", "attention"])
def any_pipeline(request, tiny_gqa_package, tiny_attention_package):
    from mobius_runtime import Pipeline

    package = tiny_gqa_package if request.param == "gqa" else tiny_attention_package
    return Pipeline.load(package, device="cpu", threads=2)


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(max_tokens=16), SamplingParams(max_tokens=16, temperature=0.9, seed=4)],
    ids=["greedy", "seeded"],
)
def test_cached_prefixes_give_the_same_ids(any_pipeline, sampling):
    plain, none = _run(any_pipeline, 0, sampling)
    cached, cache = _run(any_pipeline, 64, sampling)
    assert none is None and [n for _, n in plain] == [0] * len(PROMPTS)
    assert [ids for ids, _ in cached] == [ids for ids, _ in plain]
    assert [n for _, n in cached] == CACHED
    assert cache.hits == 3 and cache.cached_tokens == sum(CACHED)


def test_the_budget_evicts_the_least_recently_used():
    row = np.zeros((1, 2, 10, 4), dtype=np.float32)  # 320 bytes for 10 positions
    cache = PrefixCache(budget_bytes=700, seq_axis=2)
    for first in (1, 2, 3):
        cache.add([first, *range(100, 109)], {"k": (row, "tensor(float)")})
    assert len(cache) == 2 and cache.bytes == 640  # the first prompt went
    assert cache.lookup([1, *range(100, 109)]) is None
    hit = cache.lookup([2, *range(100, 105), 0, 0])
    assert hit.length == 6 and hit.values["k"][0].shape == (1, 2, 6, 4)
    cache.add([4, *range(100, 109)], {"k": (row, "tensor(float)")})  # evicts 3, not 2
    assert cache.lookup([3, *range(100, 109)]) is None
    assert cache.lookup([2, *range(100, 109)]).length == 9  # never the prompt's last id
    assert cache.lookup([2, 100, 101][: MIN_SHARED - 1]) is None  # too short a match


def test_usage_reports_cached_tokens(pipeline):
    pytest.importorskip("fastapi")
    from servekit import running

    with running(pipeline, prefix_cache_mb=32) as server:
        client = server.client()
        first = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4,
                                          temperature=0)  # fmt: skip
        again = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=4,
                                          temperature=0)  # fmt: skip
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == len(BASE)
    want = pipeline.generate(input_ids=PROMPTS[1], max_new_tokens=4)
    assert again.choices[0].text == want.text


def _logits(batcher, prompt, hit, steps=6):
    """The prompt's last logits row and the next ``steps`` rows (greedy), as float32."""
    caller = {"input_ids": np.asarray([prompt], dtype=np.int64)}
    logits, cohort = batcher.prefill(caller, len(prompt) + steps + 1, hit)
    rows = [np.asarray(logits, dtype=np.float32)]
    for _ in range(steps):
        token = int(np.argmax(rows[-1]))
        # a copy: the cohort's next step writes its logits into the same buffer
        rows.append(np.array(batcher.decode(cohort, [token])[0], dtype=np.float32))
    return np.stack(rows), cohort


def test_cached_prefixes_give_the_same_logits(any_pipeline):
    """Not only the same ids: every logit of the prefill and of the steps after it equals
    the uncached run's (measured: bit-identical on both packages' CPU kernels; the
    bound allows 1e-5 for kernels that tile a shorter prefill differently)."""
    from mobius_runtime.batching import Batcher

    batcher = Batcher(any_pipeline)
    first, second = PROMPTS[0], PROMPTS[1]  # share BASE (49 ids)
    plain, _ = _logits(batcher, second, None)
    cache = PrefixCache(64 * 1024 * 1024, seq_axis=SEQ_AXIS)
    _, cohort = _logits(batcher, first, None, steps=0)
    cache.add(first, batcher.rows(cohort, len(first)))
    hit = cache.lookup(second)
    assert hit is not None and hit.length == len(BASE)
    cached, _ = _logits(batcher, second, hit)
    assert np.isfinite(plain).all() and plain.std() > 0  # real logits, not a constant
    diff = float(np.max(np.abs(cached - plain)))
    print(f"max |cached - uncached| logit: {diff:.3g}")
    assert diff <= 1e-5


def test_prompts_with_hits_of_one_length_are_prefilled_together(any_pipeline):
    """Waiting prompts of one length whose cache hits are as long go through one batched
    prefill step where the graph allows it (``Batcher.prefill_hits``: nothing needs
    padding) and give the ids each gives alone without the cache; a prompt of another
    length is prefilled on its own."""
    sampling = SamplingParams(max_tokens=10)
    engine = Engine(any_pipeline, max_batch=8, prefix_cache_mb=64)
    engine.stops = set()
    engine.start()
    boxes: list[dict] = []

    def submit(prompt):
        done, box = threading.Event(), {"event": None}
        box["event"] = done

        def sink(kind, data, box=box, done=done):
            if kind in ("done", "error"):
                box[kind] = data
                done.set()

        box["request"] = engine.submit({"input_ids": np.asarray([prompt])}, sampling, sink)
        boxes.append(box)
        return box

    try:
        first = submit([*BASE, 11, 12, 13])  # kept: BASE is then cached
        assert first["event"].wait(60) and "done" in first, first
        with engine._cond:  # queued together, so they are admitted together
            wave = [[*BASE, 20 + i, 30 + i, 40 + i] for i in range(4)] + [[*BASE, 7, 8]]
            steps_before = engine.prefill_steps
            queued = [submit(p) for p in wave]
        for box in queued:
            assert box["event"].wait(60) and "done" in box, box
    finally:
        engine.stop()
    assert [b["done"].cached_tokens for b in queued] == [len(BASE)] * 5
    # ONNX Attention: the four together, the fifth alone; GroupQueryAttention refuses a
    # batch of several new ids after a past, so each is prefilled alone
    together = any_pipeline.batcher.batches_hits
    assert together == (any_pipeline.batcher.side == "left")
    assert engine.prefill_steps - steps_before == (2 if together else 5)
    for prompt, box in zip(wave, queued, strict=True):
        want = any_pipeline.generate(input_ids=prompt, max_new_tokens=10, stop_ids=())
        assert list(box["request"].ids) == want.ids
