"""The model package format: an atomic, streamed writer, a reader and a verifier.

Layout (see ``docs/internals.md``)::

    OUT/
      mobius.json               manifest (format_version, contract, components, files, ...)
      decoder/model.onnx        graph; initializers of 1 KiB or more are external
      decoder/model.onnx.data   tensor data, each tensor 64-byte aligned
      embedding/shared.data     tensors two components plan identically (a tied table),
      decoder/shared.data       stored once: the second is a hard link of the first
      genai_config.json, tokenizer.json, ...   runtime files

Modules, by job: :mod:`~mobius.package.manifest` (format constants, reading and
validating ``mobius.json``, hashing files), :mod:`~mobius.package.writer` (the
atomic, streamed writer), :mod:`~mobius.package.reader` (:func:`read_package`) and
:mod:`~mobius.package.verify` (:func:`verify_package`).
"""

from __future__ import annotations

from mobius.package.manifest import (
    ALIGNMENT,
    DATA_NAME,
    FORMAT_VERSION,
    INLINE_LIMIT,
    MANIFEST_NAME,
    MODEL_NAME,
    SHARED_NAME,
)
from mobius.package.reader import Package, read_package
from mobius.package.verify import verify_package
from mobius.package.writer import CHUNK_BYTES, remove_stale_siblings, write_package

__all__ = [
    "ALIGNMENT",
    "CHUNK_BYTES",
    "DATA_NAME",
    "FORMAT_VERSION",
    "INLINE_LIMIT",
    "MANIFEST_NAME",
    "MODEL_NAME",
    "SHARED_NAME",
    "Package",
    "read_package",
    "remove_stale_siblings",
    "verify_package",
    "write_package",
]
