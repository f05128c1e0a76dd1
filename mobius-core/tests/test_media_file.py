"""mobius.media: a media path must be a regular file of bounded size; nothing blocks or hangs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mobius.errors import MediaError
from mobius.media import check_media_file, read_media_file


def _within(seconds: float, fn, *args, **kw):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it blocks."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kw)
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} blocked for more than {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.parametrize("fn", [read_media_file, check_media_file])
def test_a_fifo_without_writer_is_refused_at_once(tmp_path: Path, fn) -> None:
    fifo = tmp_path / "clip.wav"
    os.mkfifo(fifo)
    with pytest.raises(MediaError) as err:
        _within(10, fn, fifo, "audio")
    assert err.value.what == f"audio path {fifo} is a named pipe (FIFO), not a regular file"
    assert err.value.where == str(fifo)


def test_a_folder_and_a_device_are_refused(tmp_path: Path) -> None:
    with pytest.raises(MediaError, match=r"image path .* is a folder, not a regular file"):
        read_media_file(tmp_path, "image")
    if Path("/dev/zero").exists():
        with pytest.raises(MediaError, match=r"is a character device, not a regular file"):
            _within(10, read_media_file, "/dev/zero", "image")


def test_a_file_over_the_limit_is_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "huge.png"
    with big.open("wb") as f:
        f.truncate(1 << 40)  # sparse: 1 TiB claimed, nothing on disk
    with pytest.raises(MediaError) as err:
        _within(10, read_media_file, big, "image")
    assert err.value.what == (
        f"image file {big} is 1,099,511,627,776 bytes, over the limit of 1,073,741,824 bytes"
    )
    small = tmp_path / "a.wav"
    small.write_bytes(b"x" * 11)
    with pytest.raises(MediaError, match="is 11 bytes, over the limit of 10 bytes"):
        read_media_file(small, "audio", max_bytes=10)


def test_missing_and_regular_files(tmp_path: Path) -> None:
    with pytest.raises(MediaError) as err:
        read_media_file(tmp_path / "nope.png", "image")
    assert (
        err.value.what
        == f"cannot read image file {tmp_path / 'nope.png'}: No such file or directory"
    )
    ok = tmp_path / "ok.wav"
    ok.write_bytes(b"RIFF1234")
    assert read_media_file(ok, "audio") == b"RIFF1234"
    assert check_media_file(ok, "audio") == ok
    link = tmp_path / "link.wav"
    link.symlink_to(ok)
    assert read_media_file(link, "audio") == b"RIFF1234"  # a link to a regular file is fine
