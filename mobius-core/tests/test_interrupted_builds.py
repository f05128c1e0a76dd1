"""Builds killed by signals leave no OUT, and the next build cleans up after a hard kill.

A driver process runs the real ``mobius build`` command (the typer app, with a
plugin host made from the ``tinytest`` family, since test plugins have no entry
points) or the library call ``mobius.build``. It pauses at a chosen point (a
component being built, half a tensor written, the finished temporary folder
just before its rename), writes a marker file, and waits to be signalled.

- SIGINT / SIGTERM: the process removes its temporary folder itself and exits
  130 / 143 (CLI).
- SIGKILL: nothing can clean up; the temporary folder stays, and the next build
  to the same OUT removes it (its pid is gone) and succeeds.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TESTS, write_tiny_checkpoint

import mobius
from mobius.package import MANIFEST_NAME, remove_stale_siblings, verify_package
from mobius.plugins import PluginHost

POINTS = ("component", "tensor", "rename")

IN_FEATURES, OUT_FEATURES = 16, 32
"""proj.weight is 16 x 32 float32 = 2 KiB: over the writer's inline limit, so external."""


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_tiny_checkpoint(
        tmp_path / "ckpt", in_features=IN_FEATURES, out_features=OUT_FEATURES
    )


DRIVER = r"""
import io, os, signal, sys, time
from pathlib import Path

# A parent started in the background (nohup, '&' without job control) passes SIGINT
# on as ignored, and Python then installs no KeyboardInterrupt handler: restore it so
# the test exercises the interactive Ctrl-C case whatever started the test run.
signal.signal(signal.SIGINT, signal.default_int_handler)

tests, source, out, point, markers, mode, *extra = sys.argv[1:]
sys.path.insert(0, tests)

import mobius
import mobius.package.writer as package
from mobius.plugins import PluginHost
from plugins_for_tests import tinytest


def pause(name):
    if name != point:
        return
    Path(markers, name).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(99)  # nobody signalled us


write_tensor = package._write_tensor


def half_then_pause(f, tensor, digest):
    buffer = io.BytesIO()
    n = write_tensor(buffer, tensor, digest)
    data = buffer.getvalue()
    f.write(data[: n // 2])
    f.flush()
    pause("tensor")
    f.write(data[n // 2 :])
    return n


move_into_place = package._move_into_place


def pause_then_move(tmp, out, notice=None, **options):
    pause("rename")
    move_into_place(tmp, out, notice, **options)


package._write_tensor = half_then_pause
package._move_into_place = pause_then_move
host = PluginHost.from_plugins({"tinytest": tinytest})

if mode == "cli":
    from mobius.cli import cmd_build, make_app

    message = cmd_build.RichProgress.message

    def slow_message(self, text):
        message(self, text)
        if text.startswith("building "):
            pause("component")

    cmd_build.RichProgress.message = slow_message
    make_app()(args=["build", source, out, *extra], prog_name="mobius", obj={"host": host})
else:
    from mobius.progress import NullProgress

    class Slow(NullProgress):
        def message(self, text):
            if text.startswith("building "):
                pause("component")

    mobius.build(source, out, host=host, progress=Slow(), force="--force" in extra)
    print("library build finished")
"""


def siblings(out: Path) -> list[str]:
    """Temporary siblings of ``out`` (what the writer makes next to it)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.mobius-"))


def start_and_pause(
    source: Path, out: Path, point: str, mode: str, tmp_path: Path, *extra: str
) -> subprocess.Popen[str]:
    """Start the driver and wait until it sits at ``point``."""
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    env = dict(os.environ, MOBIUS_PLUGINS="", COLUMNS="100")
    args = [str(TESTS), str(source), str(out), point, str(markers), mode, *extra]
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 90
    while not (markers / point).exists():
        if proc.poll() is not None:
            stdout, stderr = proc.communicate()
            pytest.fail(f"driver exited {proc.returncode} before {point}:\n{stdout}\n{stderr}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.communicate()
            pytest.fail(f"driver never reached {point}")
        time.sleep(0.02)
    return proc


def assert_paused_where_asked(out: Path, point: str) -> None:
    """The pause really is where its name says (so each case tests what it claims)."""
    temps = [out.parent / name for name in siblings(out)]
    if point == "component":
        assert temps == []  # graphs are built before anything is written
        return
    (tmp,) = temps
    assert f".mobius-tmp-{os.getpid()}-" not in tmp.name  # the driver's pid, not ours
    data = tmp / "model" / "model.onnx.data"
    if point == "tensor":
        assert data.stat().st_size == IN_FEATURES * OUT_FEATURES * 4 // 2  # half the weight
        assert not (tmp / MANIFEST_NAME).exists()
    else:
        assert (
            tmp / MANIFEST_NAME
        ).is_file() and data.stat().st_size == IN_FEATURES * OUT_FEATURES * 4


def signal_and_wait(proc: subprocess.Popen[str], sig: signal.Signals) -> tuple[str, str]:
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"driver did not stop on {sig.name}")


def good_host() -> PluginHost:
    from plugins_for_tests import tinytest

    return PluginHost.from_plugins({"tinytest": tinytest})


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize(
    ("sig", "code", "word"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
    ids=["SIGINT", "SIGTERM"],
)
def test_cli_build_stopped_by_signal_cleans_up(
    checkpoint: Path, tmp_path: Path, point: str, sig: signal.Signals, code: int, word: str
) -> None:
    out = tmp_path / "out"
    proc = start_and_pause(checkpoint, out, point, "cli", tmp_path)
    assert_paused_where_asked(out, point)
    _, stderr = signal_and_wait(proc, sig)
    assert proc.returncode == code, stderr
    assert word in stderr and "Traceback" not in stderr, stderr
    assert not out.exists()
    assert siblings(out) == []


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_leaves_a_temp_folder_the_next_build_removes(
    checkpoint: Path, tmp_path: Path, point: str
) -> None:
    out = tmp_path / "out"
    proc = start_and_pause(checkpoint, out, point, "cli", tmp_path)
    signal_and_wait(proc, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    stale = siblings(out)
    assert len(stale) == (0 if point == "component" else 1)
    assert all(f"mobius-tmp-{proc.pid}-" in name for name in stale)

    result = mobius.build(str(checkpoint), str(out), host=good_host())
    assert result.out == out.absolute()
    assert verify_package(out) == []
    assert siblings(out) == []


def test_library_build_interrupted_mid_tensor_cleans_up(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start_and_pause(checkpoint, out, "tensor", "library", tmp_path)
    assert_paused_where_asked(out, "tensor")
    stdout, stderr = signal_and_wait(proc, signal.SIGINT)
    assert proc.returncode != 0 and "KeyboardInterrupt" in stderr
    assert "finished" not in stdout
    assert not out.exists()
    assert siblings(out) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_force_build_keeps_the_old_package(
    checkpoint: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "out"
    mobius.build(str(checkpoint), str(out), host=good_host())
    before = (out / MANIFEST_NAME).read_bytes()
    proc = start_and_pause(checkpoint, out, "rename", "cli", tmp_path, "--force")
    signal_and_wait(proc, sig)
    assert proc.returncode in (130, 143)
    assert (out / MANIFEST_NAME).read_bytes() == before
    assert verify_package(out) == []
    assert siblings(out) == []


# --------------------------------------------------------------------------- stale siblings


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_siblings_of_dead_writers_of_this_out_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    gone = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            f".pkg.mobius-tmp-{gone}-abc": True,  # dead writer: removed
            f".pkg.mobius-old-{gone}-1234abcd": True,  # dead --force swap, OUT in place: removed
            f".pkg.mobius-tmp-{live.pid}-abc": False,  # another live writer
            f".pkg.mobius-tmp-{os.getpid()}-abc": False,  # this process (another thread?)
            f".pkg2.mobius-tmp-{gone}-abc": False,  # a different OUT
            ".pkg.mobius-tmp-abc": False,  # no pid: not ours to judge
            f"pkg.mobius-tmp-{gone}-abc": False,  # not hidden: not the writer's name
        }
        for name in names:
            (tmp_path / name).mkdir()
            (tmp_path / name / "model.onnx.data").write_bytes(b"x" * 10)
            pin = {"sha256": hashlib.sha256(b"x" * 10).hexdigest(), "model_size": 10}
            manifest = {
                "format_version": 1,
                "components": {"m": {"path": "model.onnx.data", **pin}},
            }
            (tmp_path / name / MANIFEST_NAME).write_text(json.dumps(manifest))
        out.mkdir()  # the swap finished: the old sibling is a superseded copy
        removed = remove_stale_siblings(out)
        assert sorted(p.name for p in removed) == sorted(n for n, gone_ in names.items() if gone_)
        left = {p.name for p in tmp_path.iterdir()}
        assert left == {"pkg"} | {n for n, gone_ in names.items() if not gone_}
    finally:
        live.kill()
        live.wait()


def test_a_stale_file_with_the_temp_name_is_left_alone(tmp_path: Path) -> None:
    stale = tmp_path / f".pkg.mobius-tmp-{dead_pid()}-abc"
    stale.write_text("a file, not a folder the writer made")
    assert remove_stale_siblings(tmp_path / "pkg") == []
    assert stale.exists()


def test_temp_folder_name_records_the_writer_pid(checkpoint: Path, tmp_path: Path) -> None:
    """The contract the clean-up relies on, checked on a real build."""
    out = tmp_path / "out"
    seen: list[str] = []

    class Spy:
        def component_started(self, name: str, n_tensors: int) -> None:
            seen.extend(siblings(out))

        def tensor_written(self, component: str, name: str, nbytes: int) -> None: ...
        def component_finished(self, name: str) -> None: ...
        def message(self, text: str) -> None: ...

    mobius.build(str(checkpoint), str(out), host=good_host(), progress=Spy())
    assert len(seen) == 1 and seen[0].startswith(f".out.mobius-tmp-{os.getpid()}-"), seen
