"""``Pipeline.load`` trusts the verification stamp instead of hashing, and still catches tampering.

The stamp (``mobius/package/stamp.py``) records each pinned file's size, mtime,
ctime, inode and device after a full check. These tests count the files hashed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import mobius.package.checks as checks
from mobius.errors import PackageError
from mobius.package import verify_package
from mobius.package.stamp import STAMP_NAME
from mobius_runtime import Pipeline


@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    seen: list[Path] = []
    real = checks._sha256_size
    monkeypatch.setattr(checks, "_sha256_size", lambda p: seen.append(p) or real(p))
    return seen


def test_a_fresh_package_loads_without_hashing(single_pkg, hashed):
    assert (single_pkg / STAMP_NAME).is_file()  # written by the writer after its checks
    Pipeline.load(single_pkg, device="cpu")
    assert hashed == []


def test_same_size_tamper_with_mtime_restored_is_caught(single_pkg, hashed):
    data = single_pkg / "model" / "model.onnx.data"
    before = data.stat()
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))  # hide it from mtime
    assert data.stat().st_size == before.st_size
    with pytest.raises(PackageError, match=r"model/model\.onnx\.data: sha256 .* does not match"):
        Pipeline.load(single_pkg, device="cpu")
    assert data.resolve() in hashed


def test_a_copied_package_is_hashed_once_then_trusted(single_pkg, tmp_path, hashed):
    copy = tmp_path / "copy"
    shutil.copytree(single_pkg, copy)  # the stamp travels, but inodes and ctimes differ
    Pipeline.load(copy, device="cpu")
    first = len(hashed)
    assert first == len(checks.pinned_files(checks.read_package(copy).manifest))
    Pipeline.load(copy, device="cpu")  # the first load re-stamped it
    assert len(hashed) == first


def test_verify_always_hashes_and_restamps(single_pkg, hashed):
    (single_pkg / STAMP_NAME).unlink()
    assert verify_package(single_pkg) == []
    assert hashed and (single_pkg / STAMP_NAME).is_file()
    hashed.clear()
    Pipeline.load(single_pkg, device="cpu")
    assert hashed == []


def test_a_package_that_cannot_be_stamped_is_hashed_on_every_load(single_pkg, hashed, monkeypatch):
    """A read-only package (the stamp's rename fails) still loads, hashing each time."""
    import mobius.package.stamp as stamp

    def read_only(src, dst):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(stamp.os, "replace", read_only)
    (single_pkg / STAMP_NAME).unlink()
    Pipeline.load(single_pkg, device="cpu")
    Pipeline.load(single_pkg, device="cpu")
    assert not (single_pkg / STAMP_NAME).exists()
    assert [p.name for p in single_pkg.iterdir() if p.name.startswith(STAMP_NAME)] == []
    assert len(hashed) == 2 * len(checks.pinned_files(checks.read_package(single_pkg).manifest))


def test_a_forged_stamp_is_ignored(single_pkg, hashed):
    """A stamp naming other identities (e.g. shipped with a download) does not match."""
    stamp = single_pkg / STAMP_NAME
    stamp.write_text(stamp.read_text().replace("[", "[1, ", 1))
    Pipeline.load(single_pkg, device="cpu")
    assert hashed
