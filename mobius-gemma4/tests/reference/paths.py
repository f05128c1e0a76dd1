"""Where the test fixtures outside the repository are.

The full-size Gemma 4 configs and the tiny config written both ways live in the
project's ``shared/`` folder, which sits beside the checkout (``../shared``) for
developers and CI alike.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SHARED_CONFIGS = REPO.parent / "shared" / "fixtures" / "configs"
"""The real full-size ``config.json`` files and ``tiny-*.json``."""

TINY_HUBSTYLE = SHARED_CONFIGS / "tiny-hubstyle.json"
"""The tiny multimodal config in hub style (global_head_dim, no per_layer_config)."""
