"""The token loop takes each step's last logits row in place: no full-vocabulary copy.

A greedy request reads the argmax where onnxruntime wrote the logits
(:func:`mobius_runtime.feeds.last_position`): the row handed to
:meth:`Decoding.take <mobius_runtime.decoding.Decoding.take>` is a view into the step's
own logits OrtValue (its pointer lies inside that buffer, it owns no data), one row of
``vocab`` values, for the prefill (whose output holds every prompt position) and for
every decode step.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")


def _nbytes(value) -> int:
    from mobius_runtime.feeds import numpy_dtype

    return int(np.prod(value.shape())) * np.dtype(numpy_dtype(value.data_type())).itemsize


def test_greedy_rows_are_views_of_the_step_logits(pipeline, monkeypatch):
    from mobius_runtime import decoding, executor

    logits_key = pipeline.plan.logits
    buffers: list[tuple[int, int, list[int]]] = []
    taken: list[tuple[int, int, bool]] = []
    real_step, real_take = executor.Steps.step, decoding.Decoding.take

    def step(*args, **kwargs):
        values = real_step(*args, **kwargs)
        v = values[logits_key]
        buffers.append((v.data_ptr(), _nbytes(v), list(v.shape())))
        return values

    def take(self, logits, *args, **kwargs):
        taken.append((logits.ctypes.data, logits.nbytes, logits.flags.owndata))
        return real_take(self, logits, *args, **kwargs)

    monkeypatch.setattr(executor.Steps, "step", step)
    monkeypatch.setattr(decoding.Decoding, "take", take)
    prompt = [2, *range(20, 40)]
    result = pipeline.generate(input_ids=[prompt], max_new_tokens=8, stop_ids=())
    assert len(result.ids) == 8 and len(taken) == 8 and len(buffers) == 8
    vocab = buffers[0][2][-1]
    assert buffers[0][2][1] in (1, len(prompt))  # the prefill: last or every position
    for (start, size, _), (ptr, nbytes, owns) in zip(buffers, taken, strict=True):
        assert not owns, "the token loop was handed a copy of the logits"
        assert nbytes == vocab * 4  # one row of float32 logits, nothing more
        assert start <= ptr and ptr + nbytes <= start + size  # inside the step's own output


def test_last_position_reads_only_the_last_row():
    from mobius_runtime.feeds import last_position, to_ortvalue

    x = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    value = to_ortvalue(x, "tensor(float)")
    row = last_position(value)
    np.testing.assert_array_equal(row, x[:, -1])
    assert not row.flags.owndata  # a view (of the value's buffer), not a copy
    bf16 = to_ortvalue(x.astype(ml_dtypes.bfloat16), "tensor(bfloat16)")
    got = last_position(bf16)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (2, 5)
    np.testing.assert_array_equal(got.astype(np.float32), x[:, -1])
