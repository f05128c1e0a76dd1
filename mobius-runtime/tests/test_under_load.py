"""Runtime under load: concurrent requests on one Pipeline, and flat memory over many.

A loaded Pipeline shares its sessions between requests; each request owns its KV
state (shared buffers or concat OrtValues), IO bindings, sampler and stream. So
requests from several threads must give exactly the ids they give one at a
time, and memory must not grow with the number of requests served.
"""

from __future__ import annotations

import gc
import os
import sys
import threading

import pytest

from mobius_runtime import Pipeline

PROMPTS = ([2, 5, 17, 33, 90, 11], [2, 100, 7], [2, *range(40, 70)], [2, 300, 301, 302, 9, 9])
NEW = 12


def _concurrent(p: Pipeline, prompts, repeats: int) -> dict[int, list[list[int]]]:
    results: dict[int, list[list[int]]] = {i: [] for i in range(len(prompts))}
    errors: list[BaseException] = []
    start = threading.Barrier(len(prompts))

    def worker(i: int) -> None:
        try:
            start.wait()
            for _ in range(repeats):
                out = p.generate(input_ids=prompts[i], max_new_tokens=NEW, stop_ids=())
                results[i].append(out.ids)
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a generating thread hung"
    assert not errors, errors
    return results


@pytest.mark.parametrize("package", ["tiny_gqa_package", "tiny_attention_package"])
def test_concurrent_requests_match_sequential(package, request):
    p = Pipeline.load(request.getfixturevalue(package), device="cpu", threads=1)
    sequential = [p.generate(input_ids=x, max_new_tokens=NEW, stop_ids=()).ids for x in PROMPTS]
    assert len({tuple(ids) for ids in sequential}) > 1  # different prompts, different ids
    for i, runs in _concurrent(p, PROMPTS, repeats=3).items():
        assert runs == [sequential[i]] * 3, f"prompt {i}"


def test_sessions_open_once_under_concurrent_first_use(tiny_gqa_package):
    p = Pipeline.load(tiny_gqa_package, device="cpu", threads=1)
    p._sessions.clear()  # as if nothing were opened yet: first use happens in 4 threads
    p.executor._io.clear()
    opened = []
    real = p.session.__func__

    def counting(self, component):
        session = real(self, component)
        opened.append(id(session))
        return session

    p.session = counting.__get__(p)
    p.executor.session_of = p.session
    _concurrent(p, PROMPTS, repeats=1)
    assert len(set(opened)) == 1


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_stays_flat_over_200_generations(tiny_gqa_package):
    p = Pipeline.load(tiny_gqa_package, device="cpu", threads=1)
    for i in range(20):  # warm-up: arenas, caches, every prompt shape once
        p.generate(input_ids=PROMPTS[i % len(PROMPTS)], max_new_tokens=8, stop_ids=())
    gc.collect()
    before = _rss_bytes()
    for i in range(200):
        p.generate(input_ids=PROMPTS[i % len(PROMPTS)], max_new_tokens=8, stop_ids=())
    gc.collect()
    growth = _rss_bytes() - before
    assert growth < 50 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 200 generations"
