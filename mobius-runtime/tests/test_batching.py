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
    from mobius_runtime.batching import padding_side

    for package, side in ((tiny_gqa_package, "right"), (tiny_attention_package, "left")):
        pipeline = Pipeline.load(package, device="cpu", threads=1)
        for comp in {key.split(".", 1)[0] for key in pipeline.plan.states}:
            found, why = padding_side(comp, pipeline._paths[comp], pipeline.plan.states)
            assert found == side, why
