"""Engine defaults the import-light ``mobius serve`` command shows in its ``--help``
(kept here, not in :mod:`mobius_runtime.engine`, which imports numpy)."""

from __future__ import annotations

PREFILL_CHUNK = 512
"""Most prompt ids prefilled between two decode steps (``mobius serve --prefill-chunk``)."""
