"""pytest collection of ``*.case.toml`` files: one item per case and level (L4, L5).

A family never writes an L4/L5 test function: it drops case files into its
tests and pytest collects them through this plugin. A malformed case file is a
collection error that names the file and the field. A case that cannot run
here (no pinned revision, no GPU, no golden yet) skips with the reason; a case
that runs and breaks (build error, runtime error, mismatch) fails, never skips.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mobius.errors import MobiusError
from mobius_testing.cases import CASE_SUFFIX, TORCH_DTYPES, Case, CaseError, load_case
from mobius_testing.gates import FAIL, LOW_CONFIDENCE, GateResult
from mobius_testing.golden import GoldenError, golden_path, read_l4, read_l5
from mobius_testing.runner import check_l4, check_l5, golden_dir_for

if TYPE_CHECKING:
    from mobius_testing.pytest_plugin import HarnessState

OUTCOME_PROPERTY = "mobius_outcome"
REPORT_PROPERTY = "mobius_report"


class LowConfidenceWarning(UserWarning):
    """A golden comparison ran but its golden margin is too small to decide it."""


class GoldenMismatch(AssertionError):
    """An L4/L5 gate failed; the message is the gate report."""


def is_case_file(path: Path) -> bool:
    return path.name.endswith(CASE_SUFFIX)


class CaseFile(pytest.File):
    """A ``*.case.toml`` file."""

    loaded = False

    def collect(self):
        case = load_case(self.path)
        self.loaded = True
        reason = case.skip_reason()  # raises for a GGUF file that is wrong or must be here
        for level in case.levels:
            item = GoldenItem.from_parent(self, name=level, case=case, level=level)
            if reason:
                # added first, so this reason wins over a later "needs a GPU"
                item.add_marker(pytest.mark.skip(reason=reason))
            yield item

    def repr_failure(self, excinfo, style=None):  # type: ignore[override]
        if isinstance(excinfo.value, CaseError):
            head = "case cannot run here" if self.loaded else "invalid case file"
            return f"{head}\n{excinfo.value}"
        return super().repr_failure(excinfo, style=style)


class GoldenItem(pytest.Item):
    """Check one case at one level against its golden, through ``mobius_runtime.Pipeline``."""

    def __init__(self, *, case: Case, level: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.level = level
        self.add_marker(getattr(pytest.mark, level))
        self.add_marker(pytest.mark.family(case.family))
        if case.gpu:
            self.add_marker(pytest.mark.gpu)
        if case.gguf:
            self.add_marker(pytest.mark.real)  # its file is what the real envs fetch
        for word in (case.size, case.family, case.id, case.dtype_label, case.task):
            self.extra_keyword_matches.add(word)  # so that `-k large` selects by shard

    @property
    def state(self) -> HarnessState:
        from mobius_testing.pytest_plugin import harness_state

        return harness_state(self.config)

    def runtest(self) -> None:
        case = self.case
        reason = case.skip_reason()
        if reason:
            pytest.skip(reason)
        gdir = golden_dir_for(case, self.state.golden_dir)
        path = golden_path(gdir, case.id, self.level)
        if not path.is_file():
            pytest.skip(
                f"no {self.level.upper()} golden at {path}: run `mobius golden regen "
                f"{case.file}` (needs the [reference] extra)"
            )
        golden = read_l4(gdir, case.id) if self.level == "l4" else read_l5(gdir, case.id)
        self._check_provenance(golden.provenance, path)
        package = self.state.builds.build(
            case.build_source(), dtype=case.dtype, target=case.target, revision=case.revision
        )
        pipeline = self.state.pipelines.load(package)
        check = check_l4 if self.level == "l4" else check_l5
        result = check(case, golden, pipeline)  # type: ignore[arg-type]
        self._record(result)

    def _check_provenance(self, provenance: Any, path: Path) -> None:
        get = provenance.get if hasattr(provenance, "get") else lambda _key, default=None: None
        case = self.case
        checks = [("reference_dtype", "float32", TORCH_DTYPES[case.reference_dtype])]
        if case.gguf:
            checks.append(("sha256", None, case.gguf_sha256))
        elif not case.local:
            checks.append(("revision", None, case.revision))
        for key, default, want in checks:
            made = get(key, default)
            if made != want:
                raise GoldenError(
                    f"the golden was made for {key} {made!r} but the case pins {want!r}",
                    where=str(path),
                    fix=f"run `mobius golden regen {case.file}`",
                )

    def _record(self, result: GateResult) -> None:
        text = result.report()
        self.user_properties.append((OUTCOME_PROPERTY, result.outcome))
        self.user_properties.append((REPORT_PROPERTY, text))
        if result.outcome == FAIL:
            raise GoldenMismatch(text)
        if result.outcome == LOW_CONFIDENCE:
            warnings.warn(
                LowConfidenceWarning(
                    f"{self.case.id} [{self.level}] low-confidence: "
                    + "; ".join([*result.problems, *result.notes])
                ),
                stacklevel=1,
            )

    def repr_failure(self, excinfo, style=None):  # type: ignore[override]
        if isinstance(excinfo.value, GoldenMismatch):
            return (
                f"{self.case.id} [{self.level.upper()}] does not match its golden\n{excinfo.value}"
            )
        if isinstance(excinfo.value, MobiusError):
            return f"{self.case.id} [{self.level.upper()}]: {excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, 0, f"{self.case.id} [{self.level.upper()}]"
