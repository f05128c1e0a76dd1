"""A disk that fills up during a build ends in a clear PackageError and leaves nothing behind.

Simulated first (the writer's file writes raise ENOSPC at each stage: tensor
data, the graph, a runtime file, the manifest), then for real on a 1 MiB tmpfs
when this machine lets the tests mount one (root on Linux), skipped otherwise.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write_tiny_checkpoint

import mobius
import mobius.package as package
import mobius.package.writer as writer
from mobius.errors import PackageError
from mobius.plugins import PluginHost

FIX = "free space or choose another OUT"

IN_FEATURES, OUT_FEATURES = 16, 32
"""proj.weight is 16 x 32 float32 = 2 KiB: over the writer's inline limit, so external."""


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_tiny_checkpoint(
        tmp_path / "ckpt", in_features=IN_FEATURES, out_features=OUT_FEATURES
    )


def host() -> PluginHost:
    from plugins_for_tests import tinytest

    return PluginHost.from_plugins({"tinytest": tinytest})


def leftovers(out: Path) -> list[str]:
    return [p.name for p in out.parent.iterdir() if p.name.startswith(out.name)] + [
        p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")
    ]


def enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def assert_disk_full_error(exc: PackageError, out: Path, file: str) -> None:
    assert f"no space left on device while writing {file}" in exc.what, exc.what
    assert exc.where == str(out.absolute())
    assert exc.fix == FIX
    assert isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.ENOSPC
    assert not out.exists()
    assert leftovers(out) == []


def test_tensor_data_write_fails_half_way(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = writer._write_tensor

    def half_then_full(f, tensor, digest):  # type: ignore[no-untyped-def]
        f.write(b"\0" * 8)
        f.flush()
        enospc()
        return original(f, tensor, digest)  # pragma: no cover - never reached

    monkeypatch.setattr(writer, "_write_tensor", half_then_full)
    out = tmp_path / "out"
    with pytest.raises(PackageError) as info:
        mobius.build(str(checkpoint), str(out), host=host())
    assert_disk_full_error(info.value, out, "model/model.onnx.data")


def test_graph_save_fails(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer.ir, "save", enospc)
    out = tmp_path / "out"
    with pytest.raises(PackageError) as info:
        mobius.build(str(checkpoint), str(out), host=host())
    assert_disk_full_error(info.value, out, "model/model.onnx")


def test_runtime_file_copy_fails(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copied runtime file: the error is about OUT's disk, not the source file."""
    from mobius.records import RuntimeFile

    source = tmp_path / "tokenizer.json"
    source.write_text("{}")
    monkeypatch.setattr(writer.shutil, "copyfile", enospc)
    out = tmp_path / "out"
    model = _bound_tiny_model(checkpoint)
    with pytest.raises(PackageError) as info:
        package.write_package(
            out,
            components={"model": model},
            manifest={"model_type": "tinytest"},
            runtime_files=[RuntimeFile("tokenizer.json", source=source)],
        )
    assert_disk_full_error(info.value, out, "tokenizer.json")


def test_manifest_write_fails(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write_text = Path.write_text

    def write_text(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.name == package.MANIFEST_NAME:
            enospc()
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    out = tmp_path / "out"
    with pytest.raises(PackageError) as info:
        mobius.build(str(checkpoint), str(out), host=host())
    assert_disk_full_error(info.value, out, package.MANIFEST_NAME)


@pytest.mark.parametrize(
    ("code", "words", "fix"),
    [
        (errno.EDQUOT, "disk quota exceeded", FIX),
        (errno.EFBIG, "file too large for the file system", "not FAT32"),
    ],
    ids=["EDQUOT", "EFBIG"],
)
def test_quota_and_file_size_limits_are_named_too(
    checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    words: str,
    fix: str,
) -> None:
    def fail(*args: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(writer, "_write_tensor", fail)
    out = tmp_path / "out"
    with pytest.raises(PackageError, match=f"{words} while writing model/model.onnx.data") as info:
        mobius.build(str(checkpoint), str(out), host=host())
    assert fix in (info.value.fix or "")
    assert leftovers(out) == []


def test_other_os_errors_are_not_reported_as_disk_full(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(writer, "_write_tensor", fail)
    out = tmp_path / "out"
    with pytest.raises(OSError) as info:
        mobius.build(str(checkpoint), str(out), host=host())
    assert info.value.errno == errno.EIO
    assert leftovers(out) == []


def test_cli_prints_the_disk_full_error_short(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from mobius.cli import make_app

    monkeypatch.setattr(writer, "_write_tensor", enospc)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        make_app(), ["build", str(checkpoint), str(out)], obj={"host": host()}
    )
    assert result.exit_code == 1
    assert "error: no space left on device while writing model/model.onnx.data" in result.stderr
    assert f"fix: {FIX}" in result.stderr and "Traceback" not in result.stderr
    assert leftovers(out) == []


def _bound_tiny_model(checkpoint: Path):  # type: ignore[no-untyped-def]
    """The tinytest graph with its weight bound to ``checkpoint``."""
    from plugins_for_tests import tinytest

    from mobius.checkpoint import open_local
    from mobius.records import BuildOptions
    from mobius.weights import bind

    options = BuildOptions()
    config = tinytest.TinyConfig(IN_FEATURES, OUT_FEATURES)
    model = tinytest.mobius_build_component(config, "model", options)
    ckpt = open_local(checkpoint)
    bind(
        model, tinytest.mobius_weight_plan(config, "model", ckpt, options), ckpt, component="model"
    )
    return model


# --------------------------------------------------------------------------- a real full disk


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted under tmp_path; skip where mounting is not allowed."""
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root on Linux")
    point = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
    point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], capture_output=True, check=False)


def test_real_full_tmpfs(tiny_tmpfs: Path, tmp_path: Path) -> None:
    # proj.weight is 512 x 1024 float32 = 2 MiB: twice the file system.
    checkpoint = write_tiny_checkpoint(tmp_path / "big", in_features=512, out_features=1024)
    out = tiny_tmpfs / "out"
    with pytest.raises(PackageError) as info:
        mobius.build(str(checkpoint), str(out), host=host())
    assert_disk_full_error(info.value, out, "model/model.onnx.data")
    assert list(tiny_tmpfs.iterdir()) == []
    # the disk is usable again: a package that fits is written there
    small = write_tiny_checkpoint(tmp_path / "small")
    mobius.build(str(small), str(out), host=host())
    assert package.verify_package(out) == []
