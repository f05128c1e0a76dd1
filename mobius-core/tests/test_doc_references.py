"""Every "§N" in core's sources names its document, and that document has section N.

Why: ``mobius/components/__init__.py`` cited a "§6" with the document's name on the line
before, which read as a section of no named document.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1]
ROOT = CORE.parent
SOURCES = sorted((CORE / "src").rglob("*.py"))
CITED = re.compile(r"(docs/[\w.-]+\.md)((?:,? §\d+(?:\.\d+)*)+)")


def _citations(text: str) -> tuple[int, list[tuple[str, str]]]:
    """(number of § signs, (document, section) pairs written as "docs/X.md §N") in ``text``."""
    pairs = []
    for match in CITED.finditer(text):  # a document and its sections on one line
        pairs += [(match.group(1), n) for n in re.findall(r"§(\d+(?:\.\d+)*)", match.group(2))]
    return text.count("§"), pairs


def test_the_pattern_catches_an_unnamed_section() -> None:
    assert _citations("see docs/a.md\n§6 for more") == (1, [])
    assert _citations("see docs/a.md §6, §7.1") == (2, [("docs/a.md", "6"), ("docs/a.md", "7.1")])


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(CORE / "src")))
def test_section_references_name_an_existing_section(source: Path) -> None:
    signs, pairs = _citations(source.read_text(encoding="utf-8"))
    assert signs == len(pairs), f"{source}: a § that follows no docs/NAME.md on its line"
    for document, number in pairs:
        path = ROOT / document
        if not path.is_file():
            pytest.skip(f"{document} is not in this checkout")
        headings = re.findall(r"^#+ (\d+(?:\.\d+)*)\.? ", path.read_text(), flags=re.M)
        assert number in headings, f"{source} cites {document} §{number}, which has no such section"


READMES = sorted([ROOT / "README.md", *ROOT.glob("mobius-*/README.md")])
BARE = re.compile(r"pip install[^\n#]*?(?<![./\w'\"-])'?\"?(mobius-[a-z0-9]+)")


def test_the_install_pattern_finds_a_bare_distribution() -> None:
    assert BARE.search("pip install mobius-core ./mobius-qwen3").group(1) == "mobius-core"
    assert BARE.search("pip install ./mobius-core './mobius-testing[reference]'") is None


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_readmes_install_from_folders_until_released(readme: Path) -> None:
    """Was: the mobius-qwen3 README's `pip install mobius-core mobius-qwen3 mobius-runtime`,
    which fails (nothing is on PyPI yet). A PyPI form is fine on a "once published" line."""
    bad = [
        line.strip()
        for line in readme.read_text(encoding="utf-8").splitlines()
        if BARE.search(line) and "once published" not in line and "-U " not in line
    ]
    assert not bad, f"{readme}: install lines naming unpublished distributions: {bad}"
