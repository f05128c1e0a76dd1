"""Shared fixtures of the mobius-llama tests (:func:`mobius_testing.lm_parity.family_fixtures`).

Tests are marked ``family("llama")`` for the harness of mobius-testing; the L3 parity
fixtures make the tiny random checkpoints of ``llama_specs.py`` with HF transformers
(torch, CPU) once per session; torch and transformers are imported only when a
reference fixture is requested.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mobius_testing import lm_parity

sys.path.insert(0, str(Path(__file__).parent))

from llama_specs import MAX_PROMPT_ID, SPECS

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "testdata"

pytest_collection_modifyitems, parity_ids, reference_cache = lm_parity.family_fixtures(
    "llama", Path(__file__).parent, SPECS, MAX_PROMPT_ID
)


@pytest.hookimpl(trylast=True)  # after mobius-testing's plugin made the harness state
def pytest_configure(config):
    # the real tests and the golden case items of cases/ share one measured build per package
    lm_parity.measure_harness_builds(config)
