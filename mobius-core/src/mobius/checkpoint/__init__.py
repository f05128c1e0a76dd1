"""Checkpoint access: safetensors headers, plain-read tensors, local and Hub openers.

Only safetensors are read (no pickle, no remote code); tensors are listed from
headers without reading data and read with plain file reads (whole, or in chunks into a
reused buffer) one at a time; source files are hashed in a background thread.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mobius.checkpoint.base import Checkpoint, SourceInfo
    from mobius.checkpoint.hub import ALLOW_PATTERNS, looks_like_repo_id, open_hub
    from mobius.checkpoint.local import SIDE_FILES, BackgroundHashes, file_sha256, open_local
    from mobius.checkpoint.safetensors import (
        DTYPE_NAMES,
        TensorInfo,
        read_safetensors_header,
        read_tensor,
        read_tensor_chunks,
        read_tensor_copy,
    )

_WHERE = {
    "Checkpoint": "base",
    "SourceInfo": "base",
    "ALLOW_PATTERNS": "hub",
    "looks_like_repo_id": "hub",
    "open_hub": "hub",
    "SIDE_FILES": "local",
    "BackgroundHashes": "local",
    "file_sha256": "local",
    "open_local": "local",
    "DTYPE_NAMES": "safetensors",
    "TensorInfo": "safetensors",
    "read_safetensors_header": "safetensors",
    "read_tensor": "safetensors",
    "read_tensor_chunks": "safetensors",
    "read_tensor_copy": "safetensors",
}
"""Public name -> submodule. Imported on first use: the package is imported when
plugins are discovered (``mobius --help``), and the submodules pull in numpy and
ml_dtypes (a second of start-up), which only reading a checkpoint needs."""


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"mobius.checkpoint.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ALLOW_PATTERNS",
    "DTYPE_NAMES",
    "SIDE_FILES",
    "BackgroundHashes",
    "Checkpoint",
    "SourceInfo",
    "TensorInfo",
    "file_sha256",
    "looks_like_repo_id",
    "open_hub",
    "open_local",
    "read_safetensors_header",
    "read_tensor",
    "read_tensor_chunks",
    "read_tensor_copy",
]
