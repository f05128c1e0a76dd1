"""The shared fuzz harness: the guard stops hangs and runaway allocations, counts are reported."""

from __future__ import annotations

import json
import resource
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

fuzz = pytest.importorskip("mobius_testing.fuzz")  # needs hypothesis (the [fuzz] extra)


def test_profile_defaults_to_the_ci_budget() -> None:
    assert fuzz.PROFILE in ("ci", "long")
    expected = {"ci": 200, "long": 20_000}[fuzz.PROFILE]
    assert fuzz.FUZZ.max_examples == expected


def test_guard_stops_an_example_that_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuzz, "TIME_LIMIT_S", 0.2)
    start = time.monotonic()
    with pytest.raises(fuzz.ExampleHung, match=r"longer than 0\.2 s"), fuzz.guard():
        time.sleep(5)
    assert time.monotonic() - start < 3
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_guard_refuses_a_runaway_allocation_and_restores_the_limit() -> None:
    if fuzz._vm_bytes() is None:
        pytest.skip("no /proc/self/statm: the memory half of the guard is off here")
    before = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(MemoryError), fuzz.guard():
        bytearray(2 * fuzz.MEMORY_LIMIT)
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_counts_are_printed_and_appended_as_json_lines(
    pytestconfig: pytest.Config,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    out = tmp_path / "counts.jsonl"
    out.write_text('{"earlier": 1}\n', encoding="utf-8")
    monkeypatch.setenv(fuzz.COUNTS_ENV, str(out))
    fuzz.write_counts(Counter({"b": 2, "a": 5}), pytestconfig)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0] == '{"earlier": 1}'
    assert [json.loads(line) for line in lines[1:]] == [
        {"profile": fuzz.PROFILE, "target": "a", "examples": 5},
        {"profile": fuzz.PROFILE, "target": "b", "examples": 2},
    ]


def test_report_counts_is_a_module_autouse_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from collections import Counter
        from mobius_testing.fuzz import report_counts

        COUNTS = Counter()
        _report_counts = report_counts(COUNTS)

        def test_one():
            COUNTS["target-x"] += 3
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"fuzz[[]{fuzz.PROFILE}[]] target-x: 3 examples"])
