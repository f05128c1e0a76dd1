"""Checkpoint access: safetensors headers, plain-read tensors, local and Hub openers.

Only safetensors are read (no pickle, no remote code); tensors are listed from
headers without reading data and read with plain file reads (whole, or in chunks into a
reused buffer) one at a time; source files are hashed in a background thread.
"""

from __future__ import annotations

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
