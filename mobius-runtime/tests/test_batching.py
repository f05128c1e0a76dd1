"""Batched decode (:mod:`mobius_runtime.batching`) equals each request decoded alone.

Eight prompts of different lengths join a running cohort at different steps and leave
when done; every request's greedy ids must equal ``Pipeline.generate`` on its own, on
both padding layouts (GroupQueryAttention: right, with shared and with concatenated
KV buffers; ONNX Attention: left). The prompts and generations are long enough to
cross the tiny model's sliding window (16).
"""

from __future__ import annotations

import numpy as np
import pytest

N_NEW = 20
PROMPTS = [
    [int(t) for t in np.random.default_rng(i).integers(7, 500, size=n)]
    for i, n in enumerate([25, 3, 17, 9, 30, 5, 12, 1])
]


def _batched(pipeline) -> tuple[list[list[int]], list[int]]:
    """Each prompt's ids when prompt i joins at step 2i; the cohort sizes of each step."""
    from mobius_runtime.batching import Batcher

    batcher = Batcher(pipeline)
    assert batcher.batches
    out: list[list[int]] = [[] for _ in PROMPTS]
    cohort, rows, sizes, pending, step = None, [], [], list(range(len(PROMPTS))), 0
    while pending or rows:
        if pending and step % 2 == 0:
            i = pending.pop(0)
            ids = np.array([PROMPTS[i]], dtype=np.int64)
            logits, alone = batcher.prefill({"input_ids": ids}, len(PROMPTS[i]) + N_NEW)
            out[i].append(int(np.argmax(logits)))
            cohort = alone if cohort is None else batcher.merge(cohort, alone)
            rows.append(i)
        keep = [k for k, i in enumerate(rows) if len(out[i]) < N_NEW]
        rows = [rows[k] for k in keep]
        cohort = batcher.keep(cohort, keep) if cohort is not None else None
        step += 1
        if not rows:
            continue
        logits = batcher.decode(cohort, [out[i][-1] for i in rows])
        sizes.append(len(rows))
        for k, i in enumerate(rows):
            out[i].append(int(np.argmax(logits[k])))
    return out, sizes


@pytest.mark.parametrize(
    ("fixture", "kv_share", "side"),
    [
        ("tiny_gqa_package", True, "right"),
        ("tiny_gqa_package", False, "right"),
        ("tiny_attention_package", True, "left"),
    ],
    ids=["gqa-shared", "gqa-concat", "attention"],
)
def test_batched_ids_equal_sequential_ids(request, fixture, kv_share, side):
    from mobius_runtime import Pipeline
    from mobius_runtime.batching import Batcher

    package = request.getfixturevalue(fixture)
    pipeline = Pipeline.load(package, device="cpu", threads=1, kv_share=kv_share)
    assert Batcher(pipeline).side == side
    alone = [pipeline.generate(input_ids=p, max_new_tokens=N_NEW, stop_ids=[]).ids for p in PROMPTS]
    batched, sizes = _batched(pipeline)
    assert max(sizes) >= 5, f"the cohort never held most requests at once: {sizes}"
    for i, (got, want) in enumerate(zip(batched, alone)):
        assert got == want, f"prompt {i} ({len(PROMPTS[i])} tokens): batched ids differ"


def test_padding_side_is_read_from_the_graph(tiny_gqa_package, tiny_attention_package):
    from mobius_runtime import Pipeline

    for package, side in ((tiny_gqa_package, "right"), (tiny_attention_package, "left")):
        pipeline = Pipeline.load(package, device="cpu", threads=1)
        for comp in {key.split(".", 1)[0] for key in pipeline.plan.states}:
            layout = pipeline.kv_layout(comp)
            assert layout.side == side, layout.side_reason


LAYOUTS = pytest.mark.parametrize(
    ("fixture", "kv_share"),
    [("tiny_gqa_package", True), ("tiny_gqa_package", False), ("tiny_attention_package", True)],
    ids=["gqa-shared", "gqa-concat", "attention"],
)


def _greedy(batcher, logits, cohort, steps: int) -> list[list[int]]:
    """Each row's argmax ids: the prefill's pick, then ``steps`` batched decode steps."""
    out = [[int(np.argmax(row))] for row in np.atleast_2d(logits)]
    for _ in range(steps):
        logits = batcher.decode(cohort, [ids[-1] for ids in out])
        for ids, row in zip(out, logits):
            ids.append(int(np.argmax(row)))
    return out


@LAYOUTS
@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_prefill_equals_one_shot(request, fixture, kv_share, chunk):
    """A prompt prefilled ``chunk`` ids at a time gives the one-step prefill's logits (the
    prompts cross the sliding window), and the same ids after it."""
    from mobius_runtime import Pipeline
    from mobius_runtime.batching import Batcher

    pipeline = Pipeline.load(request.getfixturevalue(fixture), device="cpu", threads=1,
                             kv_share=kv_share)  # fmt: skip
    batcher = Batcher(pipeline)
    for prompt in (PROMPTS[0], PROMPTS[4], PROMPTS[2]):
        caller = {"input_ids": np.array([prompt], dtype=np.int64)}
        capacity = len(prompt) + N_NEW
        whole, alone = batcher.prefill(caller, capacity)
        job = batcher.start(caller, capacity)
        steps, done = 0, None
        while done is None:
            done = batcher.advance(job, chunk)
            steps += 1
        assert steps == -(-len(prompt) // chunk)
        logits, cohort = done
        np.testing.assert_allclose(logits, whole, rtol=1e-5, atol=1e-5)
        assert cohort.pasts == alone.pasts == [len(prompt)]
        assert _greedy(batcher, logits, cohort, N_NEW) == _greedy(batcher, whole, alone, N_NEW)


@LAYOUTS
def test_prompts_prefilled_together_equal_each_alone(request, fixture, kv_share):
    """Prompts of different lengths prefilled in one padded step: each row's first logits
    are its own prompt's, and its ids are ``generate()``'s, also after joining a cohort."""
    from mobius_runtime import Pipeline
    from mobius_runtime.batching import Batcher

    pipeline = Pipeline.load(request.getfixturevalue(fixture), device="cpu", threads=1,
                             kv_share=kv_share)  # fmt: skip
    batcher = Batcher(pipeline)
    prompts = PROMPTS[:5]
    logits, cohort = batcher.prefill_many(prompts, [len(p) + N_NEW for p in prompts])
    assert cohort.pasts == [len(p) for p in prompts]
    for prompt, row in zip(prompts, logits):
        alone, _ = batcher.prefill({"input_ids": np.array([prompt])}, len(prompt) + N_NEW)
        np.testing.assert_allclose(row, alone, rtol=1e-4, atol=1e-4)
    # a running request joins the prefilled ones
    running, single = batcher.prefill({"input_ids": np.array([PROMPTS[5]])}, 40)
    first = int(np.argmax(running))
    step = batcher.decode(single, [first])
    cohort = batcher.merge(single, cohort)
    out = _greedy(batcher, np.vstack([step, logits]), cohort, N_NEW - 1)
    want = [pipeline.generate(input_ids=p, max_new_tokens=N_NEW + 1, stop_ids=[]).ids
            for p in (PROMPTS[5], *prompts)]  # fmt: skip
    assert out[0] == want[0][1 : N_NEW + 1]
    for got, full in zip(out[1:], want[1:]):
        assert got == full[:N_NEW]


@LAYOUTS
@pytest.mark.parametrize("chunk", [0, 5, 512])
def test_engine_prefill_chunks_give_generate_ids(request, fixture, kv_share, chunk):
    """Eight requests at once through the engine, prompts chunked (5 ids a step), prefilled
    together (512) or whole and alone (0): every request's ids are ``generate()``'s."""
    import threading

    from mobius_runtime import Pipeline
    from mobius_runtime.engine import Engine
    from mobius_runtime.sampling import SamplingParams

    pipeline = Pipeline.load(request.getfixturevalue(fixture), device="cpu", threads=1,
                             kv_share=kv_share)  # fmt: skip
    want = [pipeline.generate(input_ids=p, max_new_tokens=N_NEW, stop_ids=[]).ids for p in PROMPTS]
    engine = Engine(pipeline, max_batch=8, prefill_chunk=chunk)
    done = [threading.Event() for _ in PROMPTS]
    got: list[list[int]] = [[] for _ in PROMPTS]
    sampling = SamplingParams(max_tokens=N_NEW, stop_ids=())
    requests = []
    for i, prompt in enumerate(PROMPTS):

        def sink(kind, data, i=i):
            if kind in ("done", "error"):
                done[i].set()

        caller = {"input_ids": np.array([prompt], dtype=np.int64)}
        requests.append(engine.submit(caller, sampling, sink))
    engine.start()
    try:
        for event in done:
            assert event.wait(120)
    finally:
        engine.stop()
    for i, r in enumerate(requests):
        got[i] = r.ids
    assert got == want
    assert engine.prefills == len(PROMPTS)
    longest = max(len(p) for p in PROMPTS)
    if chunk == 5:  # the longest prompt alone took several steps
        assert engine.prefill_steps >= -(-longest // 5)
    elif chunk == 512:  # all eight were waiting at start: one step prefilled them all
        assert engine.prefill_steps == 1
    else:
        assert engine.prefill_steps == len(PROMPTS)


def test_each_graph_is_read_once_for_its_kv_layout(tiny_gqa_package, monkeypatch):
    """The share plan (executor) and the padding side (batcher) come from one read of the
    graph, however many batchers are made."""
    import onnx

    from mobius_runtime import Pipeline
    from mobius_runtime.batching import Batcher

    reads: list[str] = []
    load = onnx.load

    def counting(f, *args, **kwargs):
        reads.append(str(f))
        return load(f, *args, **kwargs)

    monkeypatch.setattr(onnx, "load", counting)
    pipeline = Pipeline.load(tiny_gqa_package, device="cpu", threads=1)
    Batcher(pipeline)
    Batcher(pipeline)
    stateful = {key.split(".", 1)[0] for key in pipeline.plan.states}
    assert stateful
    for comp in stateful:
        assert reads.count(str(pipeline._paths[comp])) == 1, reads
        assert pipeline.kv_layout(comp).share is not None  # GQA: shared buffers
        assert pipeline.kv_layout(comp).side == "right"
