"""The errors mobius raises on purpose.

Every error a user can cause (a bad folder, a broken file, a plugin that does not
fit) is a :class:`MobiusError`: it says *what* went wrong, *where* (a file, a
tensor, a component, a plugin) and *how to fix it*. The CLI prints these three
parts without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class MobiusError(Exception):
    """Base of every error mobius raises for bad input or a bad environment."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        parts = [self.what]
        if self.where:
            parts.append(f"  where: {self.where}")
        if self.fix:
            parts.append(f"  fix: {self.fix}")
        return "\n".join(parts)


class PluginError(MobiusError):
    """A plugin is missing, failed to load, conflicts with another, or raised in a hook."""

    plugin_bug: bool = False
    """True when a plugin raised something that is not a MobiusError (a bug in it)."""


class ConfigError(MobiusError):
    """config.json is missing, not JSON, or describes something no plugin serves."""


class CheckpointError(MobiusError):
    """A checkpoint folder or Hub repository cannot be used as given."""


class SafetensorsError(CheckpointError):
    """A safetensors file is malformed (header, offsets, sizes)."""


class WeightPlanError(MobiusError):
    """Initializers could not be bound to checkpoint tensors (missing, wrong shape, bad transform)."""


class ContractError(MobiusError):
    """A pipeline contract is inconsistent with itself or with the graphs it describes."""


class PackageError(MobiusError):
    """A model package cannot be written, read or trusted (OUT exists, hash mismatch, bad manifest)."""


class MediaError(MobiusError):
    """An image or audio input cannot be used: not a regular file, too large, corrupt, absurd."""


class BuildError(MobiusError):
    """A build failed for a reason not covered by a more specific error."""
