"""Where the test fixtures are: inside the repository, under ``testdata/configs``.

The full-size Gemma 4 configs and the tiny config written both ways are copied there
with their provenance (``testdata/configs/PROVENANCE.md``); nothing outside the
checkout is read.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "testdata" / "configs"
"""The real full-size ``config.json`` files and ``tiny-*.json``."""

TINY_HUBSTYLE = CONFIGS / "tiny-hubstyle.json"
"""The tiny multimodal config in hub style (global_head_dim, no per_layer_config)."""
