"""Shared fixtures of the mobius-qwen3 tests (:func:`mobius_testing.lm_parity.family_fixtures`).

Tests are marked ``family("qwen3")`` for the harness of mobius-testing. The L3 parity
fixtures make tiny random checkpoints (qwen3_ref/: specs, and Qwen3's checkpoint maker)
with HF transformers (torch, CPU) once per session and cache builds by (spec, config
shape, dtype, target); torch and transformers are imported only when a reference
fixture is requested.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mobius_testing import lm_parity

sys.path.insert(0, str(Path(__file__).parent))

from qwen3_ref.fixtures import make_checkpoint
from qwen3_ref.specs import MAX_PROMPT_ID, SPECS

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "testdata"

pytest_collection_modifyitems, parity_ids, reference_cache = lm_parity.family_fixtures(
    "qwen3", Path(__file__).parent, SPECS, MAX_PROMPT_ID, make_checkpoint
)
