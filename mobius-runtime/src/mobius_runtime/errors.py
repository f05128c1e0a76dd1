"""Errors the runtime raises for requests a package cannot serve.

They subclass :class:`mobius.errors.MobiusError`, so ``mobius run`` (and the core
CLI) print what / where / fix without a traceback.
"""

from __future__ import annotations

from mobius.errors import MobiusError


class RequestError(MobiusError):
    """A generate/forward request the package cannot serve (missing input, too long, no modality)."""


class DeviceError(MobiusError):
    """The requested device cannot run here (e.g. ``cuda`` without a usable CUDA provider)."""
