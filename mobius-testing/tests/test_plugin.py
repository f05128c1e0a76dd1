"""The pytest plugin on throwaway projects (pytester): options, markers, case items, outcomes."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from mt_helpers import PROMPT, FakePipeline, l5_golden

from mobius_testing.golden import Inputs, l4_from_logits, write_l4, write_l5

TABLE = {2: 3, 7: 8, 9: 10, 11: 12, 12: 13, 13: 14, 14: 15}
"""Next-token table of the fake pipeline: after the prompt (…, 11) it says 12, 13, 14, 15."""

LEVEL_TESTS = """
import pytest

@pytest.mark.l1
def test_one(): pass

@pytest.mark.l3
def test_three(): pass

@pytest.mark.l4
def test_four(): pass

def test_plain(): pass

@pytest.mark.family("gemma4")
def test_gemma(): pass

@pytest.mark.family("other")
def test_other(): pass

@pytest.mark.gpu
def test_gpu(): pass
"""


def test_levels_option_skips_other_levels_with_a_reason(pytester):
    pytester.makepyfile(LEVEL_TESTS)
    result = pytester.runpytest("--levels", "l1,l4", "--device", "cpu", "-rs")
    result.assert_outcomes(passed=5, skipped=2)
    result.stdout.fnmatch_lines(["*level l3 not selected (--levels l1,l4)*"])


def test_families_option_skips_other_families(pytester):
    pytester.makepyfile(LEVEL_TESTS)
    result = pytester.runpytest("--families", "gemma4", "--device", "cpu", "-rs")
    result.assert_outcomes(passed=5, skipped=2)
    result.stdout.fnmatch_lines(["*family other not selected (--families gemma4)*"])


def test_gpu_marker_skips_on_cpu(pytester):
    pytester.makepyfile(LEVEL_TESTS)
    result = pytester.runpytest("--device", "cpu", "-rs", "-m", "gpu")
    result.assert_outcomes(skipped=1, deselected=6)
    result.stdout.fnmatch_lines(["*needs a GPU: run with --device cuda*"])


def test_markers_are_registered_for_strict_markers(pytester):
    pytester.makepyfile(LEVEL_TESTS)
    result = pytester.runpytest("--strict-markers", "--device", "cpu")
    result.assert_outcomes(passed=6, skipped=1)
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.l4:*", "@pytest.mark.family(name):*"])


def test_unknown_level_is_a_usage_error(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--levels", "l1,l7")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--levels: unknown value(s) l7*"])


def test_invalid_case_file_is_a_collection_error_naming_file_and_field(pytester):
    path = pytester.path / "bad.case.toml"
    path.write_text('family = "x"\npath = "."\ntask = "text-generation"\ndtype = "f64"\n')
    result = pytester.runpytest("--device", "cpu")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*invalid case file*", f"*{path}: field 'dtype'*"])


# ---------------------------------------------------------------------- case items

CASE = """
family = "fake"
path = "ckpt"
task = "text-generation"
dtype = "f32"
levels = ["l4", "l5"]
[inputs]
prompt = "unused: the golden stores the ids"
[tolerances]
min_margin = {min_margin}
[l5]
max_new_tokens = 4
"""

CONFTEST = """
import pytest
from mobius_testing.pytest_plugin import harness_state
from mt_helpers import FakePipeline

class Builds:
    def build(self, source, **kw):
        return source

class Pipes:
    def __init__(self, pipeline):
        self.pipeline = pipeline
    def load(self, package, device=None):
        return self.pipeline

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    state = harness_state(config)
    state.builds = Builds()
    state.pipelines = Pipes(FakePipeline({table}, generate_ids={generate}, scale={scale}))
"""


def make_case_project(
    pytester, *, min_margin=0.05, scale=1.0, generate=None, goldens=True, name="fake"
) -> Path:
    helpers = Path(__file__).with_name("mt_helpers.py").read_text()
    pytester.makepyfile(mt_helpers=helpers)
    pytester.makeconftest(
        textwrap.dedent(CONFTEST).format(table=TABLE, generate=generate, scale=scale)
    )
    (pytester.path / "ckpt").mkdir()
    case = pytester.path / f"{name}.case.toml"
    case.write_text(CASE.format(min_margin=min_margin))
    if goldens:
        gdir = pytester.path / "goldens"
        logits = FakePipeline(TABLE).forward([list(PROMPT)])["logits"]
        write_l4(gdir, l4_from_logits(name, Inputs(PROMPT), logits, 5, {"revision": None}))
        write_l5(gdir, l5_golden([12, 13, 14, 15], case=name))
    return case


def test_case_items_pass_through_the_pipeline(pytester):
    make_case_project(pytester)
    result = pytester.runpytest("--device", "cpu", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*fake.case.toml::l4 PASSED*", "*fake.case.toml::l5 PASSED*"])


def test_case_items_are_selected_by_levels_and_size_keyword(pytester):
    make_case_project(pytester)
    result = pytester.runpytest("--device", "cpu", "--levels", "l5", "-k", "tiny")
    result.assert_outcomes(passed=1, skipped=1)
    result = pytester.runpytest("--device", "cpu", "-k", "large")
    result.assert_outcomes(deselected=2)


def test_l4_value_mismatch_fails_with_the_gate_report(pytester):
    make_case_project(pytester, scale=2.0)
    result = pytester.runpytest("--device", "cpu", "--levels", "l4")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        ["*fake [[]L4] does not match its golden*", "*logits are outside atol*"]
    )


def test_low_margin_is_its_own_outcome_with_a_warning_and_a_summary(pytester):
    make_case_project(pytester, min_margin=100.0)
    result = pytester.runpytest("--device", "cpu", "--levels", "l4")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "*LowConfidenceWarning: fake [[]l4] low-confidence*",
            "*mobius low-confidence golden comparisons*",
            "*fake.case.toml::l4*",
            "*below min_margin 100*",
            "*1 low-confidence*",
        ]
    )
    assert " passed" not in result.stdout.lines[-1]


def test_l5_reports_first_divergence_and_blames_the_decode_path(pytester):
    make_case_project(pytester, generate=[12, 13, 99, 15])
    result = pytester.runpytest("--device", "cpu", "--levels", "l5")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*greedy generate: first divergence at generated position 2*expected 14 '<14>'*"
            "got 99 '<99>'*",
            "*suspect the decode path*",
        ]
    )


def test_missing_golden_skips_with_the_regen_command(pytester):
    make_case_project(pytester, goldens=False)
    result = pytester.runpytest("--device", "cpu", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*no L4 golden at*run `mobius golden regen*"])


def test_golden_dir_option_points_elsewhere(pytester):
    make_case_project(pytester)
    (pytester.path / "goldens").rename(pytester.path / "elsewhere")
    result = pytester.runpytest("--device", "cpu", "--golden-dir", "elsewhere")
    result.assert_outcomes(passed=2)


# ---------------------------------------------------------------------- lane summary


def test_summary_counts_the_case_items_that_ran(pytester):
    make_case_project(pytester)
    result = pytester.runpytest("--device", "cpu")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*mobius golden cases*", "2 of 2 selected case item(s) ran; 0 skipped, 0 deselected*"]
    )
    assert "NO GOLDEN CASE RAN" not in result.stdout.str()


def test_a_lane_whose_cases_all_skip_says_no_case_ran(pytester, monkeypatch):
    make_case_project(pytester, goldens=False)
    step_summary = pytester.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    result = pytester.runpytest("--device", "cpu")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            "NO GOLDEN CASE RAN: 0 of 2 selected case item(s) ran; 2 skipped, 0 deselected*",
            "  1 skipped: no L4 golden at*",
            "  1 skipped: no L5 golden at*",
            "*this run checked no model against a golden*",
        ]
    )
    text = step_summary.read_text()
    assert text.startswith("### mobius golden cases\n") and "- NO GOLDEN CASE RAN: 0 of 2" in text


def test_a_lane_whose_keyword_matches_no_case_says_no_case_ran(pytester):
    make_case_project(pytester)
    result = pytester.runpytest("--device", "cpu", "-k", "large")
    result.assert_outcomes(deselected=2)
    result.stdout.fnmatch_lines(
        ["NO GOLDEN CASE RAN: 0 of 0 selected case item(s) ran; 0 skipped, 2 deselected*"]
    )


def test_no_case_files_no_case_summary(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--device", "cpu")
    result.assert_outcomes(passed=1)
    assert "mobius golden cases" not in result.stdout.str()


# ---------------------------------------------------------------------- GGUF cases

GGUF_DATA = b"GGUF stand-in bytes"


def make_gguf_project(pytester, monkeypatch, *, golden_sha=None, file=True) -> Path:
    """A ``gguf`` case whose file lies in $MOBIUS_REAL_MODELS (fake pipeline, as above)."""
    import hashlib

    make_case_project(pytester, goldens=False)
    (pytester.path / "fake.case.toml").unlink()
    sha = hashlib.sha256(GGUF_DATA).hexdigest()
    models = pytester.path / "models"
    models.mkdir()
    if file:
        (models / "m.gguf").write_bytes(GGUF_DATA)
    for var in ("MOBIUS_REAL_CACHE", "MOBIUS_REAL_REQUIRED"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MOBIUS_REAL_MODELS", str(models))
    case = pytester.path / "g.case.toml"
    text = CASE.format(min_margin=0.05).replace(
        'path = "ckpt"', f'gguf = "m.gguf"\nsha256 = "{sha}"'
    )
    case.write_text(text.replace('dtype = "f32"\n', ""))
    gdir = pytester.path / "goldens"
    logits = FakePipeline(TABLE).forward([list(PROMPT)])["logits"]
    prov = {"sha256": golden_sha or sha, "reference_dtype": "float32"}
    write_l4(gdir, l4_from_logits("g", Inputs(PROMPT), logits, 5, prov))
    golden5 = l5_golden([12, 13, 14, 15], case="g")
    write_l5(gdir, dataclasses.replace(golden5, provenance=prov))
    return case


def test_gguf_case_items_run_marked_real(pytester, monkeypatch):
    make_gguf_project(pytester, monkeypatch)
    result = pytester.runpytest("--device", "cpu", "-v", "-m", "real")
    result.assert_outcomes(passed=2)
    result = pytester.runpytest("--device", "cpu", "-m", "not real")
    result.assert_outcomes(deselected=2)


def test_gguf_golden_made_from_another_file_fails(pytester, monkeypatch):
    make_gguf_project(pytester, monkeypatch, golden_sha="cd" * 32)
    result = pytester.runpytest("--device", "cpu", "g.case.toml::l4")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*made for sha256 '{'cd' * 32}' but the case pins*"])


def test_absent_gguf_skips_or_fails_where_required(pytester, monkeypatch):
    make_gguf_project(pytester, monkeypatch, file=False)
    result = pytester.runpytest("--device", "cpu", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*m.gguf is not here*tox -e real-fake*"])
    monkeypatch.setenv("MOBIUS_REAL_REQUIRED", "1")
    result = pytester.runpytest("--device", "cpu")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*case cannot run here*", "*MOBIUS_REAL_REQUIRED is set*"])


def test_build_cache_keeps_the_builders_record_once_per_key(tmp_path):
    from mobius_testing.runner import BuildCache

    calls = []

    def builder(source, out, *, dtype, target, revision):
        calls.append((source, dtype))
        return f"record {len(calls)}"

    cache = BuildCache(tmp_path, builder)
    kept = cache.build("x.gguf", dtype=None)
    assert cache.build("x.gguf", dtype=None) == kept and "kept" in kept.name
    f32 = cache.build("x.gguf", dtype="f32")
    assert calls == [("x.gguf", None), ("x.gguf", "f32")] and len(cache) == 2
    assert cache.records == {kept: "record 1", f32: "record 2"}
