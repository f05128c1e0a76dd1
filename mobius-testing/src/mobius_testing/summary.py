"""The golden-case summary of a pytest session: how many L4/L5 case items ran.

Why: a GPU lane (``-k small`` …) whose cases all skip (every real case still
``revision = "unpinned"``, no golden yet, no GPU) or that ``-k`` / ``-m`` matched to
nothing exits 0 like a lane that checked every model. The summary names that: a
section ``mobius golden cases`` with ran / skipped / deselected counts and the skip
reasons, headed ``NO GOLDEN CASE RAN`` when zero ran, also appended (markdown) to
``$GITHUB_STEP_SUMMARY`` when GitHub Actions sets it, so the lane's page says so too.
Printed only in sessions that collected at least one case file.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CaseTally:
    """Golden items of one session: selected after ``-k`` / ``-m``, and deselected."""

    selected: list[str] = field(default_factory=list)
    deselected: int = 0

    @property
    def collected(self) -> int:
        return len(self.selected) + self.deselected


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ").strip()


def outcomes(tally: CaseTally, stats: dict[str, list[Any]]) -> tuple[set[str], dict[str, str]]:
    """(nodeids that ran their check, {nodeid: skip reason}) among the selected items."""
    wanted = set(tally.selected)
    ran: set[str] = set()
    skipped: dict[str, str] = {}
    for reports in stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", None)
            if nodeid not in wanted:
                continue
            if getattr(report, "skipped", False):
                skipped[nodeid] = _skip_reason(report)
            elif getattr(report, "when", None) == "call":
                ran.add(nodeid)
    return ran - set(skipped), skipped


def summary_lines(tally: CaseTally, stats: dict[str, list[Any]]) -> tuple[bool, list[str]]:
    """(whether zero cases ran, the lines of the summary)."""
    ran, skipped = outcomes(tally, stats)
    n = len(tally.selected)
    none = not ran
    head = (
        f"NO GOLDEN CASE RAN: 0 of {n} selected case item(s) ran"
        if none
        else f"{len(ran)} of {n} selected case item(s) ran"
    )
    lines = [f"{head}; {len(skipped)} skipped, {tally.deselected} deselected (-k / -m)"]
    for reason, count in Counter(skipped.values()).most_common():
        lines.append(f"  {count} skipped: {reason}")
    if none:
        lines.append(
            "  this run checked no model against a golden: pin revisions / add goldens, "
            "or run where the cases can run"
        )
    return none, lines


def write_terminal(terminalreporter: Any, tally: CaseTally) -> None:
    if not tally.collected:
        return
    none, lines = summary_lines(tally, terminalreporter.stats)
    terminalreporter.section(
        "mobius golden cases", sep="=", **({"red": True, "bold": True} if none else {"green": True})
    )
    for line in lines:
        terminalreporter.write_line(line)
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write("### mobius golden cases\n\n")
            f.write("".join(f"- {line.strip()}\n" for line in lines) + "\n")
