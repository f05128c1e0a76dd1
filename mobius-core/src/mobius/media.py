"""Reading image and audio files that a user names, for any family's processors.

A media path is untrusted input. Opening a FIFO with no writer blocks forever, a
character device (``/dev/zero``) never ends, and a sparse file can claim a terabyte.
:func:`read_media_file` therefore opens without blocking (``O_NONBLOCK``), checks the
*opened* file (no race with a swap after a ``stat``) is a regular file no larger than
``max_bytes``, and only then reads it. :func:`check_media_file` does the same checks
without reading, for commands that validate their arguments before loading a model.
Every refusal is a :class:`mobius.errors.MediaError` naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mobius.errors import MediaError

MAX_MEDIA_BYTES = 1 << 30
"""Largest media file read (1 GiB): far above any image or 30 s clip a model takes."""


def _kind_of(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(path: str | os.PathLike[str], kind: str, max_bytes: int) -> tuple[int, int]:
    """``(fd, size)`` of ``path`` opened read-only, refused unless a regular file."""
    where = str(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise MediaError(
            f"cannot read {kind} file {where}: {exc.strerror or exc}",
            where=where,
            fix=f"pass an existing, readable {kind} file",
        ) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MediaError(
                f"{kind} path {where} is {_kind_of(info.st_mode)}, not a regular file",
                where=where,
                fix=f"pass a {kind} file (a pipe or device would be read without end)",
            )
        if info.st_size > max_bytes:
            raise MediaError(
                f"{kind} file {where} is {info.st_size:,} bytes, over the limit of "
                f"{max_bytes:,} bytes",
                where=where,
                fix=f"pass a smaller {kind} file",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def check_media_file(
    path: str | os.PathLike[str], kind: str, *, max_bytes: int = MAX_MEDIA_BYTES
) -> Path:
    """``path`` if it is a readable regular file of at most ``max_bytes``, else MediaError."""
    fd, _ = _open_regular(path, kind, max_bytes)
    os.close(fd)
    return Path(path)


def read_media_file(
    path: str | os.PathLike[str], kind: str, *, max_bytes: int = MAX_MEDIA_BYTES
) -> bytes:
    """The bytes of the regular file ``path`` (``kind``: "image", "audio", for messages)."""
    fd, _ = _open_regular(path, kind, max_bytes)
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise MediaError(
            f"cannot read {kind} file {path}: {exc.strerror or exc}",
            where=str(path),
            fix=f"pass a readable {kind} file",
        ) from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise MediaError(
            f"{kind} file {path} is over the limit of {max_bytes:,} bytes",
            where=str(path),
            fix=f"pass a smaller {kind} file",
        )
    return data
