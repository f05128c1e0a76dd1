"""Progress reporting for builds, as a protocol.

The build pipeline and the package writer report what they do through
:class:`BuildProgress`; the CLI implements it with rich bars on stderr, library
callers pass nothing and get :class:`NullProgress`. Keeping it a protocol keeps
rich out of the build machinery.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class BuildProgress(Protocol):
    """Callbacks a build makes while it works."""

    def component_started(self, name: str, n_tensors: int) -> None:
        """Writing component ``name`` begins; it has ``n_tensors`` tensors to write."""

    def tensor_written(self, component: str, name: str, nbytes: int) -> None:
        """Tensor ``name`` of ``component`` (``nbytes`` bytes) is on disk."""

    def component_finished(self, name: str) -> None:
        """Component ``name`` is completely written."""

    def message(self, text: str) -> None:
        """An informational line (a build stage, unused tensors)."""


class NullProgress:
    """A :class:`BuildProgress` that ignores everything."""

    def component_started(self, name: str, n_tensors: int) -> None:
        """Ignore."""

    def tensor_written(self, component: str, name: str, nbytes: int) -> None:
        """Ignore."""

    def component_finished(self, name: str) -> None:
        """Ignore."""

    def message(self, text: str) -> None:
        """Ignore."""
