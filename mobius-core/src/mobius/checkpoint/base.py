"""The :class:`Checkpoint` a build reads weights from, and where it came from.

A checkpoint is always a folder on disk by the time mobius sees it (a Hub snapshot
is a folder in the HuggingFace cache), so one class serves every source; the
openers in :mod:`mobius.checkpoint.local` and :mod:`mobius.checkpoint.hub` only
differ in how they find the folder and what they record in :class:`SourceInfo`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

import numpy as np

from mobius.checkpoint.safetensors import (
    TensorInfo,
    read_tensor_chunks,
    read_tensor_copy,
)
from mobius.errors import CheckpointError


@dataclass(frozen=True)
class SourceInfo:
    """Provenance of a checkpoint, stored in the package manifest."""

    source: str
    """What the user typed: a folder path or a Hub id."""
    kind: str
    """``"local"`` or ``"hub"`` (plugins adding sources pick their own word)."""
    revision: str | None
    """The revision the user asked for (Hub only)."""
    commit: str | None
    """The resolved Hub commit; ``None`` for local folders."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Relative file name -> sha256 hex of config, tokenizer and weight files (sorted).
    Local openers give a :class:`~mobius.checkpoint.local.BackgroundHashes`: reading it
    waits for the hashing thread."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form for the manifest; ``files`` stays the (possibly still hashing)
        mapping, which ``json`` cannot take directly: convert it with ``dict()``, as the
        package writer does when it writes the manifest, after the tensors."""
        return {
            "source": self.source,
            "kind": self.kind,
            "revision": self.revision,
            "commit": self.commit,
            # The mapping itself, not a dict copy: local checkpoints hash their files in
            # a background thread (BackgroundHashes), and the package writer turns this
            # into JSON after the tensors are written, so hashing overlaps the build.
            "files": self.files,
        }


class Checkpoint:
    """Tensors (from safetensors headers) and side files of one checkpoint folder.

    Nothing is read from the weights until :meth:`read` (a whole tensor) or
    :meth:`read_chunks` (a range, piece by piece) is called, both by plain file reads. A checkpoint may hold zero tensors (a folder with only
    ``config.json``, for graph-only builds); :meth:`require_weights` turns that
    into an error saying why, for builds that need weights.
    """

    def __init__(
        self,
        root: Path,
        source: SourceInfo,
        raw_config: dict[str, Any],
        tensors: Mapping[str, TensorInfo],
        *,
        no_weights_reason: str | None = None,
        no_weights_fix: str | None = None,
        confine: Path | None = None,
    ) -> None:
        self.root = Path(root)
        self._confine = confine
        self.source = source
        self.raw_config = raw_config
        self.tensors: Mapping[str, TensorInfo] = MappingProxyType(dict(tensors))
        self._no_weights_reason = no_weights_reason
        self._no_weights_fix = no_weights_fix

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.root)!r}, kind={self.source.kind!r}, {len(self.tensors)} tensors)"

    @property
    def has_weights(self) -> bool:
        """Whether any tensor was found."""
        return bool(self.tensors)

    def require_weights(self) -> None:
        """Raise :class:`CheckpointError` (saying why) when the checkpoint has no tensors."""
        if self.tensors:
            return
        raise CheckpointError(
            self._no_weights_reason or "the checkpoint has no safetensors weights",
            where=str(self.root),
            fix=self._no_weights_fix
            or "put model.safetensors (or shards with model.safetensors.index.json) "
            "beside config.json, or build the graph only",
        )

    def info(self, name: str) -> TensorInfo:
        """Header information of tensor ``name``; CheckpointError if it does not exist."""
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(
                f"tensor {name!r} is not in the checkpoint",
                where=str(self.root),
                fix="check the tensor name in the weight plan against the safetensors headers",
            ) from None

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` in a fresh array (BF16 as ml_dtypes.bfloat16), by plain file reads.

        Not a memory map: touched pages of a mapping count in the process's resident
        set for as long as the mapping lives; a fresh array is freed when dropped.
        :func:`mobius.checkpoint.read_tensor` still gives a memory-mapped view.
        """
        return read_tensor_copy(self.info(name))

    def read_chunks(self, name: str, begin: int, end: int, step: int) -> Iterator[np.ndarray]:
        """Flat elements ``begin:end`` of tensor ``name`` in 1-D chunks of at most ``step``
        elements, read into one reused buffer (a chunk is valid until the next one)."""
        return read_tensor_chunks(self.info(name), begin, end, step)

    def file(self, relative: str) -> Path | None:
        """Path of a side file such as ``tokenizer.json`` inside the checkpoint, or None.

        A file that is a symlink leading out of the checkpoint folder raises
        :class:`CheckpointError` rather than being handed to a reader.
        """
        rel = PurePosixPath(relative.replace("\\", "/"))
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            return None
        path = self.root.joinpath(*rel.parts)
        if not path.is_file():
            return None
        from mobius.checkpoint.local import confined

        confined(path, self._confine if self._confine is not None else self.root.resolve())
        return path
