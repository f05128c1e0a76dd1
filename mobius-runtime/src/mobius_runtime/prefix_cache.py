"""Prompt KV state kept across requests: a new prompt that begins like a recent one
prefills only what differs.

After a text-only prompt is prefilled, its KV rows (one row, every prompt position, as
numpy) are kept under its ids. A later prompt reuses the longest run of ids it shares
with any kept prompt from its first id (at least :data:`MIN_SHARED` ids, and never its
last id: the model must still compute the logits of the last position): the KV of those
positions depends on those ids alone, so the reused rows are the ones a full prefill
computes and the request continues from there. Kept prompts are evicted least recently
used first when their bytes pass the budget (``mobius serve --prefix-cache-mb``).
Prompts with media are neither kept nor served (their soft tokens carry encoder features
the ids do not name).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MIN_SHARED = 4  # fewer shared ids than this: prefilling them costs less than the copy


Rows = Mapping[str, tuple[np.ndarray, str]]  # state key → (one row as numpy, ORT type)


@dataclass
class Hit:
    """The kept KV rows of a prompt's first ``length`` ids (seq axis cut to ``length``)."""

    length: int
    values: dict[str, tuple[np.ndarray, str]]


class PrefixCache:
    """KV rows of recent prompts, LRU within ``budget_bytes`` (thread-safe)."""

    def __init__(self, budget_bytes: int, seq_axis: int) -> None:
        self.budget = int(budget_bytes)
        self.seq_axis = seq_axis
        self._entries: collections.OrderedDict[tuple[int, ...], Rows] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0  # lookups that reused kept rows
        self.misses = 0
        self.cached_tokens = 0  # prompt ids served from kept rows, in all

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> Hit | None:
        """The longest kept prefix of ``ids`` (all but its last id at most), or None."""
        best, best_key = 0, None
        with self._lock:
            for key in self._entries:
                n = _shared(key, ids)
                if n > best:
                    best, best_key = n, key
            best = min(best, len(ids) - 1)
            if best_key is None or best < MIN_SHARED:
                self.misses += 1
                return None
            self._entries.move_to_end(best_key)
            kept = self._entries[best_key]
            self.hits += 1
            self.cached_tokens += best
        cut = {
            k: (np.take(v, np.arange(best), axis=self.seq_axis), kind)
            for k, (v, kind) in kept.items()
        }
        return Hit(best, cut)

    def add(self, ids: Sequence[int], values: Rows) -> None:
        """Keep ``values`` (one row; the seq axis as long as ``ids``) under ``ids``."""
        key = tuple(int(i) for i in ids)
        size = _size(values)
        if size > self.budget or len(key) < MIN_SHARED:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= _size(old)
            self._entries[key] = dict(values)
            self._bytes += size
            while self._bytes > self.budget:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= _size(evicted)


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    """How many ids ``a`` and ``b`` share from their start."""
    n = min(len(a), len(b))
    left = np.asarray(a[:n], dtype=np.int64)
    right = np.asarray(b[:n], dtype=np.int64)
    differ = np.flatnonzero(left != right)
    return int(differ[0]) if differ.size else n


def _size(rows: Rows) -> int:
    return sum(int(array.nbytes) for array, _ in rows.values())
