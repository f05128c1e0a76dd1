"""A request's steps keep their IO bindings (:class:`mobius_runtime.executor.Steps`).

Exact: every step's logits equal those of steps run on fresh bindings, on the shared-KV
(GroupQueryAttention) and the concat (ONNX Attention) builds. Cheap: from the second
one-token step of a greedy request on, a step of the shared-KV build binds one new
input, the attention mask (its length grows), and the token loop's steps write the
logits into the buffer of the step before (``Steps.recycle``): the KV buffers, the ids
array the token loop writes in place and the position array stay bound from the step
before.
"""

from __future__ import annotations

import numpy as np
import pytest

from mobius_runtime import Pipeline, iobind
from mobius_runtime.feeds import to_numpy

pytest.importorskip("onnxruntime")

PROMPT = [2, *range(30, 52)]


def _logits(
    p: Pipeline, kept: bool, new: int = 10, recycle: bool = False
) -> tuple[list[int], list[np.ndarray]]:
    """Greedy ids and every step's logits, on one Steps (kept; its logits recycled or not)
    or a fresh binding per step."""
    ex = p.executor
    capacity = len(PROMPT) + new
    steps = ex.steps(capacity, p.batcher.recycle if recycle else frozenset())

    def step(caller, state, past):
        if kept:
            return steps.step(caller, state, past)
        return ex.step(caller, state, past, capacity)

    ids_array = np.zeros((1, 1), dtype=np.int64)  # written in place, as the token loop does
    values = step({"input_ids": np.array([PROMPT])}, None, 0)
    past, ids, rows = len(PROMPT), [], []
    for _ in range(new):
        rows.append(to_numpy(values[p.plan.logits])[0, -1].copy())
        ids.append(int(np.argmax(rows[-1])))
        ids_array[0, 0] = ids[-1]
        values = step({"input_ids": ids_array}, ex.next_state(values), past)
        past += 1
    return ids, rows


@pytest.mark.parametrize("build", ["tiny_gqa_package", "tiny_attention_package"])
def test_kept_bindings_give_the_same_logits(build, request):
    p = Pipeline.load(request.getfixturevalue(build), device="cpu", threads=2)
    fresh_ids, fresh = _logits(p, kept=False)
    for recycle in (False, True):
        kept_ids, kept = _logits(p, kept=True, recycle=recycle)
        assert kept_ids == fresh_ids
        for a, b in zip(kept, fresh, strict=True):
            np.testing.assert_array_equal(a, b)


def test_recycled_logits_follow_the_step_shape(tiny_gqa_package):
    """A steady step writes the logits into the last steady step's OrtValue only when it
    has that step's batch and length: a two-id step gets a buffer of its own shape, and
    every step's logits equal those of a Steps that recycles nothing."""
    p = Pipeline.load(tiny_gqa_package, device="cpu", threads=2)
    key = p.plan.logits
    assert p.batcher.recycle == {key}  # [batch, sequence_len, V] follows from the ids
    feeds = [[PROMPT], [[40]], [[41]], [[42]], [[43]], [[44, 45]], [[46]]]

    def run(recycle: frozenset[str]) -> tuple[list[np.ndarray], list]:
        steps = p.executor.steps(len(PROMPT) + 8, recycle)
        values = steps.step({"input_ids": np.array(feeds[0])}, None, 0)
        past, rows, made = len(PROMPT), [], []
        for ids in feeds[1:]:
            values = steps.step({"input_ids": np.array(ids)}, p.executor.next_state(values), past)
            past += len(ids[0])
            rows.append(to_numpy(values[key]).copy())
            made.append(values[key])
        return rows, made

    plain, _ = run(frozenset())
    rows, made = run(p.batcher.recycle)
    for a, b in zip(rows, plain, strict=True):
        np.testing.assert_array_equal(a, b)
    # steps 1 (general) and 2 (the first steady one) allocate; 3 and 4 reuse step 2's
    assert made[2] is made[1] and made[3] is made[1] and made[0] is not made[1]
    assert made[4] is not made[1] and made[4].shape() == [1, 2, rows[0].shape[-1]]
    assert made[5] is not made[1]  # after a two-id step, a one-id step allocates again


class _Counting:
    """The C-level binding, counting which names each step binds."""

    def __init__(self, inner, log: list[list[str]]) -> None:
        self._inner, self._log = inner, log

    def bind_ortvalue_input(self, name, value):
        self._log[-1].append(f"in:{name}")
        return self._inner.bind_ortvalue_input(name, value)

    def bind_ortvalue_output(self, name, value):
        self._log[-1].append(f"out:{name}")
        return self._inner.bind_ortvalue_output(name, value)

    def bind_input(self, name, *address):  # a host array bound by its address
        self._log[-1].append(f"in:{name}")
        return self._inner.bind_input(name, *address)

    def bind_output(self, name, device):
        self._log[-1].append(f"device:{name}")
        return self._inner.bind_output(name, device)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Running:
    """The C-level session: each run starts the next step's list of binds."""

    def __init__(self, inner, log: list[list[str]]) -> None:
        self._inner, self._log = inner, log

    def run_with_iobinding(self, binding, options):
        self._inner.run_with_iobinding(binding._inner, options)
        self._log.append([])

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _count_binds(monkeypatch) -> list[list[str]]:
    """From now on every StepBinding counts its binds: one list of names per step (a run's
    run starts the next list); skips where there is no C-level binding."""
    log: list[list[str]] = [[]]
    real_init = iobind.StepBinding.__init__

    def init(self, session):
        real_init(self, session)
        if not self._fast:
            pytest.skip("this onnxruntime has no C-level IO binding")
        self._c = _Counting(self._c, log)
        self._sess = _Running(self._sess, log)

    monkeypatch.setattr(iobind.StepBinding, "__init__", init)
    return log


def test_a_decode_step_binds_only_the_growing_mask(tiny_gqa_package, monkeypatch):
    log = _count_binds(monkeypatch)
    p = Pipeline.load(tiny_gqa_package, device="cpu", threads=2)
    assert p.kv_sharing == {"model": True}
    result = p.generate(input_ids=[PROMPT], max_new_tokens=6, stop_ids=())
    assert len(result.ids) == 6
    prefill, *decode, after = log
    assert after == []  # nothing bound after the last step
    assert len(decode) == 5
    assert sum(n.startswith("in:past_key_values") for n in prefill) == 8  # bound once
    assert sum(n.startswith("out:present") for n in prefill) == 8
    # the first one-token step binds its [1, 1] ids and position (the prefill had the
    # prompt's); from then on they are written in place. The logits are allocated by
    # the first two and then written into the second one's buffer (Steps.recycle)
    assert decode[0] == ["in:input_ids", "in:attention_mask", "in:position_ids", "device:logits"]
    assert decode[1] == ["in:attention_mask", "device:logits"]
    assert decode[2] == ["in:attention_mask", "out:logits"]
    for binds in decode[3:]:
        assert binds == ["in:attention_mask"]


def test_a_batched_decode_step_keeps_its_kv_buffers_bound(tiny_gqa_package, monkeypatch):
    """A cohort of several rows keeps its bindings too (:meth:`Batcher.decode`): after its
    first step, a step binds the new ids, mask and positions, never the shared KV
    buffers; its logits are allocated by the first steady step and written into that
    buffer from then on (Steps.recycle), equal to fresh bindings' bit for bit."""
    from mobius_runtime.batching import Batcher

    p = Pipeline.load(tiny_gqa_package, device="cpu", threads=2)
    batcher = Batcher(p)
    prompts = [PROMPT, PROMPT[:15], PROMPT[:9]]

    def run(kept: bool) -> list[np.ndarray]:
        logits, cohort = batcher.prefill_many(prompts, [len(PROMPT) + 8] * len(prompts))
        rows = []
        for _ in range(6):
            tokens = np.asarray(logits).argmax(-1).tolist()
            if not kept:
                cohort.steps = None  # a fresh binding at every step: the old behaviour
            logits = batcher.decode(cohort, tokens)
            rows.append(np.array(logits, copy=True))
        return rows

    fresh = run(kept=False)
    log = _count_binds(monkeypatch)
    kept = run(kept=True)
    for a, b in zip(kept, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    _prefill, first, *later, after = log
    assert after == []
    assert sum(n.startswith("in:past_key_values") for n in first) == 8  # bound once
    assert len(later) == 5
    for i, binds in enumerate(later):
        logits = ["device:logits"] if i == 0 else ["out:logits"] if i == 1 else []
        assert sorted(binds) == sorted(
            ["in:attention_mask", "in:input_ids", "in:position_ids", *logits]
        )


def test_a_one_row_cohort_remembers_its_exact_buffers(tiny_attention_package):
    """``Batcher._unpadded`` trusts the values dict its own one-row step made (no shape
    reads per token) and reads the shapes again for any other dict, or once trimmed."""
    from mobius_runtime.batching import Batcher
    from mobius_runtime.feeds import to_ortvalue

    p = Pipeline.load(tiny_attention_package, device="cpu", threads=2)
    batcher = Batcher(p)
    logits, cohort = batcher.prefill_many([PROMPT], [len(PROMPT) + 8])
    batcher.decode(cohort, [int(np.asarray(logits).argmax(-1)[0])])
    assert cohort.exact is cohort.values and batcher._unpadded(cohort)
    padded = {}
    for key, value in cohort.values.items():
        array = to_numpy(value)
        wide = np.concatenate([np.zeros_like(array[:, :, :1]), array], axis=2)
        padded[key] = to_ortvalue(np.ascontiguousarray(wide), value.data_type())
    cohort.values = padded  # not a dict the step made: its shapes are read
    assert not batcher._unpadded(cohort)
    cohort.values = cohort.exact
    cohort.pasts = [cohort.pasts[0] - 1]  # as if a position were no longer used
    batcher._trim(cohort)  # cuts the buffers in place: the mark is cleared
    assert cohort.exact is None
    assert batcher._unpadded(cohort)  # read from the shapes: trimmed to exactly the past


def _decoded(package, decode_steps: int):
    """PROMPT prefilled on one Steps with room for 8 more ids, then ``decode_steps`` greedy
    one-token steps: (pipeline, steps, the last step's values, positions fed, the [1, 1]
    ids array the steps read, holding the last id fed)."""
    p = Pipeline.load(package, device="cpu", threads=2)
    ex = p.executor
    steps = ex.steps(len(PROMPT) + 8)
    values = steps.step({"input_ids": np.array([PROMPT])}, None, 0)
    past, ids = len(PROMPT), np.zeros((1, 1), dtype=np.int64)
    for _ in range(decode_steps):
        ids[0, 0] = int(np.argmax(to_numpy(values[p.plan.logits])[0, -1]))
        values = steps.step({"input_ids": ids}, ex.next_state(values), past)
        past += 1
    return p, steps, values, past, ids


def _copies(state):
    """Each state value copied into a new OrtValue of its own (same dtype, same values)."""
    from mobius_runtime.feeds import to_ortvalue

    return {
        k: to_ortvalue(np.ascontiguousarray(to_numpy(v)), v.data_type()) for k, v in state.items()
    }


def test_a_step_with_other_buffers_binds_them_again(tiny_gqa_package, monkeypatch):
    """The steady path (no per-port visit) holds only while the shared buffers are the very
    state values of the step before: handed copies, a step binds each of them again and
    its logits are those of a fresh binding."""

    log = _count_binds(monkeypatch)
    # the first decode step sets the steady state, the next ones use it
    p, steps, values, past, ids = _decoded(tiny_gqa_package, 3)
    ex, capacity = p.executor, steps.capacity
    assert log[-2] == ["in:attention_mask", "device:logits"]
    state = _copies(ex.next_state(values))
    fresh_state = _copies(state)
    ids[0, 0] = int(np.argmax(to_numpy(values[p.plan.logits])[0, -1]))
    got = steps.step({"input_ids": ids}, state, past)
    rebound = log[-2]
    assert sum(n.startswith("in:past_key_values") for n in rebound) == 8
    assert sum(n.startswith("out:present") for n in rebound) == 8
    want = ex.step({"input_ids": ids.copy()}, fresh_state, past, capacity)
    np.testing.assert_array_equal(to_numpy(got[p.plan.logits]), to_numpy(want[p.plan.logits]))


@pytest.mark.parametrize(
    ("build", "kept"), [("tiny_gqa_package", True), ("tiny_attention_package", False)]
)
def test_a_shared_cohort_keeps_its_state_mapping(build, kept, request):
    """From the second one-token step on, a request on shared KV buffers hands the step the
    very mapping it handed the last one (``Steps.state_kept``: its next state is those
    buffers); a concat request gets a new state every step. Both give the ids of steps on
    fresh bindings."""
    from mobius_runtime.batching import Batcher

    p = Pipeline.load(request.getfixturevalue(build), device="cpu", threads=2)
    batcher = Batcher(p)
    logits, cohort = batcher.prefill_many([PROMPT], [len(PROMPT) + 8])
    seen, ids = [], []
    for _ in range(5):
        ids.append(int(np.asarray(logits).argmax(-1)[0]))
        logits = batcher.decode(cohort, [ids[-1]])
        seen.append(cohort.values)
    assert cohort.steps.state_kept is kept
    assert (seen[1] is seen[-1]) is kept
    fresh_ids, _ = _logits(p, kept=False, new=5)
    assert ids == fresh_ids


def test_a_failed_step_leaves_no_stale_binding(tiny_gqa_package, monkeypatch):
    """A step that fails after binding other buffers (here: onnxruntime's run raises)
    must not let the next step trust the bindings: stepping on with the request's own
    state gives the logits of a fresh binding (and the present buffers it writes are the
    request's own, not the failed step's)."""
    from mobius_runtime.feeds import to_ortvalue

    # the second decode step runs on the steady path
    p, steps, values, past, ids = _decoded(tiny_gqa_package, 2)
    ex, capacity = p.executor, steps.capacity
    state = ex.next_state(values)
    copies = _copies(state)
    other = {k: to_ortvalue(np.zeros_like(to_numpy(v)), v.data_type()) for k, v in state.items()}
    ids[0, 0] = int(np.argmax(to_numpy(values[p.plan.logits])[0, -1]))

    def fail(self, skip=()):
        raise RuntimeError("onnxruntime failed")

    with monkeypatch.context() as m:
        m.setattr(iobind.StepBinding, "run", fail)
        with pytest.raises(RuntimeError, match="onnxruntime failed"):
            steps.step({"input_ids": ids}, other, past)  # binds other's buffers, then fails
    got = steps.step({"input_ids": ids}, state, past)
    want = ex.step({"input_ids": ids.copy()}, copies, past, capacity)
    np.testing.assert_array_equal(to_numpy(got[p.plan.logits]), to_numpy(want[p.plan.logits]))


def test_logits_are_recycled_only_when_the_ids_fix_their_shape(tiny_gqa_package):
    """``Batcher.recycle`` is decided from the logits' graph shape: the last position's
    ([batch, 1, V]) or every position's when that axis is the ids' own sequence axis;
    never a symbolic vocabulary, another axis, or a device other than the CPU."""
    p = Pipeline.load(tiny_gqa_package, device="cpu", threads=2)
    batcher, key = p.batcher, p.plan.logits
    ids_axis = next(d for n, _, d in p.executor.io(key.split(".")[0])[0] if n == "input_ids")[1]
    assert batcher._recyclable(["batch", 1, 512]) == {key}
    assert batcher._recyclable(["batch", ids_axis, 512]) == {key}
    assert batcher._recyclable(["batch", "total_sequence_len", 512]) == frozenset()
    assert batcher._recyclable(["batch", 1, "vocab"]) == frozenset()
    assert batcher._recyclable(None) == frozenset()
    p.executor.device = "cuda"  # as a CUDA pipeline's executor reads
    try:
        assert batcher._recyclable(["batch", 1, 512]) == frozenset()
    finally:
        p.executor.device = "cpu"
