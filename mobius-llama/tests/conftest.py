"""Shared fixtures of the mobius-llama tests.

Tests are marked ``family("llama")`` for the harness of mobius-testing; the L3 parity
fixtures (:mod:`mobius_testing.lm_parity`) make the tiny random checkpoints of
``llama_specs.py`` with HF transformers (torch, CPU) once per session; torch and
transformers are imported only when a reference fixture is requested.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from mobius_testing import lm_parity

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "testdata"


@pytest.fixture(scope="session")
def parity_ids() -> np.ndarray:
    from llama_specs import MAX_PROMPT_ID

    return lm_parity.parity_ids(MAX_PROMPT_ID)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lm_parity.mark_family(items, Path(__file__).parent, "llama")


@pytest.fixture(scope="session")
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> lm_parity.ReferenceCache:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llama_specs import SPECS

    return lm_parity.ReferenceCache(tmp_path_factory.mktemp("llama-l3"), SPECS)
