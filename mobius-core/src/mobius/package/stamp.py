"""The verification stamp: proof that a package's files passed the full check, cheaply re-checked.

Hashing every file of a 10 GB package takes seconds (minutes for 50 GB), too slow
for every ``Pipeline.load``. After a full check (``mobius build``, ``mobius
verify``, or a load that had to hash) the checker writes ``.mobius-verified.json``
into the package: for the manifest and every file it pins, the identity of the
file as the file system reports it, ``(size, mtime_ns, ctime_ns, inode, device)``
of the file the path resolves to. A later load re-stats those files (microseconds
each) and trusts the earlier hashes only when every identity is unchanged.

Why this catches tampering: any write to a file changes its mtime and ctime; a
file replaced by another (``cp``, ``mv``, a symlink swapped in) has another inode;
``os.utime`` can set mtime back but not ctime, which the kernel sets on every
change and no unprivileged call can choose. A stamp shipped inside a downloaded
package is worthless to its author: the inodes and ctimes of the unpacked copy are
made on the user's machine and cannot be predicted, so it never matches and the
first load hashes everything. What a stamp does not catch is a change below the
file system (bit rot, a disk edited offline): ``mobius verify`` always hashes.

The stamp also records :data:`CHECKS_VERSION`; a mobius whose checks changed
ignores stamps written by an older one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Any

STAMP_NAME = ".mobius-verified.json"
TMP_NAME = re.compile(re.escape(STAMP_NAME) + r"\.\d+-[0-9a-f]{8}\.tmp")
"""The temporary file :func:`write` renames over the stamp (left behind if it was killed)."""
STAMP_VERSION = 1
CHECKS_VERSION = 1
"""Bump when :func:`mobius.package.checks.check_package` checks more than before."""


def identity(info: os.stat_result) -> list[int]:
    """What the stamp keeps of one file's stat: size, mtime, ctime, inode, device."""
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev]


def _read(path: Path) -> dict[str, Any] | None:
    """The stamp at ``path`` when it is a regular file holding a stamp (of any version)."""
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > 16 * 1024 * 1024:
            return None
        stamp = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return stamp if isinstance(stamp, dict) and "stamp_version" in stamp else None


def is_stamp(path: Path) -> bool:
    """Whether ``path`` is a stamp mobius wrote (so it may be replaced or deleted)."""
    return _read(path) is not None


def matches(root: Path, identities: dict[str, list[int]]) -> bool:
    """Whether the stamp in ``root`` records exactly ``identities`` (relative path -> identity).

    Any unreadable, malformed or foreign stamp simply does not match.
    """
    stamp = _read(root / STAMP_NAME)
    return (
        stamp is not None
        and stamp.get("stamp_version") == STAMP_VERSION
        and stamp.get("checks_version") == CHECKS_VERSION
        and stamp.get("files") == identities
    )


def write(root: Path, identities: dict[str, list[int]]) -> bool:
    """Write the stamp atomically (a temporary file renamed over it); False when it cannot.

    A read-only package cannot be stamped; it is then hashed on every load, which
    is slower but just as safe, so failing to write is not an error. Nor is a
    ``.mobius-verified.json`` that is not a stamp (a link, a folder, someone's
    file): it is never replaced.
    """
    if os.path.lexists(root / STAMP_NAME) and not is_stamp(root / STAMP_NAME):
        return False
    stamp: dict[str, Any] = {
        "stamp_version": STAMP_VERSION,
        "checks_version": CHECKS_VERSION,
        "note": "written by mobius after a full check of this package; "
        "safe to delete (the next load hashes every file again)",
        "files": identities,
    }
    tmp = root / f"{STAMP_NAME}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, root / STAMP_NAME)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True
