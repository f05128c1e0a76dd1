"""Synthetic goldens and a fake pipeline, so gates and items are tested without a model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from mobius_testing.golden import Inputs, L5Golden, l4_from_logits

VOCAB = 32
PROMPT = (2, 7, 9, 11)


def synthetic_logits(seed: int = 0, margin: float = 2.0) -> np.ndarray:
    """Logits [S, V] whose every position has a clear top-1 (``margin`` above the rest)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 0.3, size=(len(PROMPT), VOCAB))
    for pos in range(len(PROMPT)):
        top = (5 * pos + 3) % VOCAB
        logits[pos, top] = logits[pos].max() + margin
    return logits


def l4_golden(logits: np.ndarray, case: str = "c"):
    return l4_from_logits(case, Inputs(PROMPT), logits, 5, {"revision": None})


def l5_golden(ids, margins=None, pieces=None, case: str = "c") -> L5Golden:
    ids = tuple(ids)
    return L5Golden(
        case=case,
        inputs=Inputs(PROMPT),
        ids=ids,
        text="".join(pieces or ()),
        pieces=tuple(pieces or (f"<{i}>" for i in ids)),
        margins=tuple(margins if margins is not None else [1.0] * len(ids)),
        stop_ids=(1,),
        stop_reason="max_new_tokens",
        max_new_tokens=len(ids),
        provenance={"revision": None},
    )


class FakePipeline:
    """The slice of ``mobius_runtime.Pipeline`` the harness uses: forward, generate, text.

    Logits come from a fixed next-token table: position i predicts ``table[ids[i]]``.
    """

    def __init__(self, table: dict[int, int], generate_ids=None, scale: float = 1.0) -> None:
        self.table = table
        self.generate_ids = generate_ids
        self.scale = scale
        self.text = SimpleNamespace(decode=lambda ids: "".join(f"<{i}>" for i in ids))
        self.contract = SimpleNamespace(
            externals=(SimpleNamespace(name="input_ids", kind="caller"),)
        )

    def forward(self, input_ids, **media):
        ids = np.asarray(input_ids)[0]
        logits = np.zeros((1, len(ids), VOCAB))
        for i, tid in enumerate(ids):
            logits[0, i, self.table.get(int(tid), 0)] = 3.0 * self.scale
        return {"logits": logits}

    def generate(self, input_ids, max_new_tokens, do_sample, stop_ids):
        assert do_sample is False
        if self.generate_ids is not None:
            return SimpleNamespace(ids=list(self.generate_ids), text="")
        ids, out = list(input_ids), []
        for _ in range(max_new_tokens):
            nxt = self.table.get(ids[-1], 0)
            out.append(nxt)
            ids.append(nxt)
            if nxt in stop_ids:
                break
        return SimpleNamespace(ids=out, text="")
