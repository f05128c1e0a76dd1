"""``mobius build SRC OUT [--force]`` never deletes or overwrites anything of the user's.

Each case builds through the real CLI (the typer app with a ``tinytest`` host) and
asserts the one-line error AND that every file under the test's folder (the
user's checkpoint, their other files) is still there byte for byte, with no
temporary sibling left. The policy itself is :mod:`mobius.outdir`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from conftest import write_tiny_checkpoint
from typer.testing import CliRunner

from mobius.cli import make_app
from mobius.errors import PackageError
from mobius.outdir import check_output_file, remove_stale_siblings, write_file
from mobius.package import MANIFEST_NAME, verify_package
from mobius.plugins import PluginHost


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root``: file bytes, link targets, folders (mode included)."""
    seen: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                seen[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                seen[rel] = ("dir", stat.S_IMODE(path.stat().st_mode))
            else:
                seen[rel] = ("file", path.read_bytes())
    return seen


def build(host: PluginHost, source: Path | str, out: Path | str, *extra: str):
    return CliRunner().invoke(
        make_app(), ["build", str(source), str(out), *extra], obj={"host": host}
    )


def assert_refused(result, *needles: str) -> str:
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    error = result.stderr[result.stderr.index("error: ") :]
    assert len(error.splitlines()) <= 3, error
    first = error.splitlines()[0]
    for needle in needles:
        assert needle in first, error
    return error


@pytest.fixture
def user(tmp_path: Path) -> Path:
    """A user's folder: a checkpoint and some precious files beside it."""
    write_tiny_checkpoint(tmp_path / "ckpt")
    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "thesis.tex").write_text("\\section{mine}")
    return tmp_path


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "force"])
@pytest.mark.parametrize(
    ("out", "needle"),
    [
        ("ckpt", "is the source checkpoint"),
        ("ckpt/pkg", "is inside the source checkpoint"),
        (".", "is a parent of the source checkpoint"),
        ("work", "not a mobius package"),
        ("notes.txt", "is a file, not a folder"),
        ("notes.txt/pkg", "notes.txt is a file, not a folder"),
        ("work/..", "ends in '..'"),
    ],
)
def test_out_relative_to_the_user_files_is_refused(
    tiny_host, user: Path, monkeypatch, tmp_path_factory, out: str, needle: str, force: list[str]
) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))  # not a parent of OUT
    before = snapshot(user)
    result = build(tiny_host, user / "ckpt", user / out, *force)
    assert_refused(result, needle)
    assert snapshot(user) == before


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "force"])
@pytest.mark.parametrize("out", [".", "..", "work/.."], ids=["cwd", "parent", "a-dotdot"])
def test_current_folder_and_its_parents_are_refused(
    tiny_host, user: Path, monkeypatch, out: str, force: list[str]
) -> None:
    other = write_tiny_checkpoint(user / "elsewhere" / "ckpt")
    monkeypatch.chdir(user / "work")
    before = snapshot(user)
    result = build(tiny_host, other, out, *force)
    error = assert_refused(result)
    assert "current folder" in error or "ends in '..'" in error
    assert snapshot(user) == before


@pytest.mark.parametrize("out", ["HOME", "HOME/.."], ids=["home", "home-parent"])
def test_home_folder_and_its_parents_are_refused(
    tiny_host, user: Path, monkeypatch, tmp_path_factory, out
) -> None:
    home = user / "home"
    home.mkdir()
    (home / ".bashrc").write_text("alias ll='ls -l'")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    target = home if out == "HOME" else user
    before = snapshot(user)
    result = build(tiny_host, user / "ckpt", target, "--force")
    assert_refused(result, "the home folder")
    assert snapshot(user) == before


@pytest.mark.parametrize("dangling", [False, True], ids=["link", "dangling-link"])
def test_a_symlink_out_is_refused(tiny_host, user: Path, dangling: bool) -> None:
    target = user / "target"
    if not dangling:
        assert build(tiny_host, user / "ckpt", target).exit_code == 0
    (user / "out").symlink_to(target, target_is_directory=True)
    before = snapshot(user)
    result = build(tiny_host, user / "ckpt", user / "out", "--force")
    assert_refused(result, "symbolic link")
    assert snapshot(user) == before
    assert not [p for p in user.iterdir() if ".mobius-" in p.name]


def test_a_package_holding_user_files_is_not_replaced(tiny_host, user: Path) -> None:
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    (out / "README-mine.md").write_text("how I built this")
    before = snapshot(user)
    result = build(tiny_host, user / "ckpt", out, "--force")
    assert_refused(result, "not the package's as built", "README-mine.md")
    assert snapshot(user) == before


def test_a_package_is_replaced_only_with_force(tiny_host, user: Path) -> None:
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    before = snapshot(user)
    assert_refused(build(tiny_host, user / "ckpt", out), "already holds a mobius package")
    assert snapshot(user) == before
    first = (out / MANIFEST_NAME).read_bytes()
    result = build(tiny_host, user / "ckpt", out, "--force")
    assert result.exit_code == 0, (result.output, result.exception)
    assert verify_package(out) == []
    assert (out / MANIFEST_NAME).read_bytes() != b"" and first
    after = snapshot(user)
    # everything outside the package is as it was; no sibling left behind
    assert {k: v for k, v in after.items() if not k.startswith("out")} == {
        k: v for k, v in before.items() if not k.startswith("out")
    }
    assert not [p for p in user.iterdir() if ".mobius-" in p.name]


def test_an_empty_folder_is_used_without_force(tiny_host, user: Path) -> None:
    (user / "out").mkdir()
    result = build(tiny_host, user / "ckpt", user / "out")
    assert result.exit_code == 0, (result.output, result.exception)
    assert verify_package(user / "out") == []


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_package_folders_follow_the_umask(tiny_host, user: Path, mask: int) -> None:
    old = os.umask(mask)
    try:
        out = user / f"out-{mask:o}"
        assert build(tiny_host, user / "ckpt", out).exit_code == 0
        assert build(tiny_host, user / "ckpt", out, "--force").exit_code == 0
    finally:
        os.umask(old)
    for folder in (out, out / "model"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~mask, folder
    assert stat.S_IMODE((out / MANIFEST_NAME).stat().st_mode) == 0o666 & ~mask


# --------------------------------------------------------------------------- interrupted swaps


def dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_an_old_sibling_holding_the_only_copy_is_restored(tiny_host, user: Path) -> None:
    """A --force build killed between its two renames: OUT is gone, the old sibling has it."""
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    package = snapshot(out)
    old = user / f".out.mobius-old-{dead_pid()}-1234abcd"
    out.rename(old)
    result = build(tiny_host, user / "ckpt", out)  # no --force: restored, then refused
    error = assert_refused(result, "already holds a mobius package")
    assert "restored" in result.stderr and old.name in result.stderr, error
    assert snapshot(out) == package and not old.exists()


def test_a_restored_package_is_then_replaced_with_force(tiny_host, user: Path) -> None:
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    old = user / f".out.mobius-old-{dead_pid()}-1234abcd"
    out.rename(old)
    result = build(tiny_host, user / "ckpt", out, "--force")
    assert result.exit_code == 0, (result.output, result.exception)
    assert verify_package(out) == []
    assert not [p for p in user.iterdir() if ".mobius-" in p.name]


def test_an_old_sibling_with_user_files_is_kept(tiny_host, user: Path) -> None:
    """An old sibling that is not a package (an old mobius replaced a user folder) is kept."""
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    old = user / f".out.mobius-old-{dead_pid()}-1234abcd"
    old.mkdir()
    (old / "data.csv").write_text("1,2,3")
    result = build(tiny_host, user / "ckpt", out, "--force")
    assert result.exit_code == 0, (result.output, result.exception)
    assert (old / "data.csv").read_text() == "1,2,3"
    assert f"kept {old}: left by an interrupted build" in result.stderr


def test_stale_siblings_from_a_symlink_replacement_are_cleaned(user: Path) -> None:
    """What an older mobius left after --force on a symlink: the link, renamed aside."""
    target = user / "work"
    out = user / "out"
    out.mkdir()
    link = user / f".out.mobius-old-{dead_pid()}-1234abcd"
    link.symlink_to(target, target_is_directory=True)
    before = snapshot(target)
    assert remove_stale_siblings(out) == [link]
    assert not os.path.lexists(link)
    assert snapshot(target) == before  # the link's target is untouched


def test_a_partly_removed_old_package_is_cleaned(tiny_host, user: Path) -> None:
    """Killed while removing the old package: its manifest goes last, so it is recognised."""
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    old = user / f".out.mobius-old-{dead_pid()}-1234abcd"
    assert build(tiny_host, user / "ckpt", old.with_name("copy")).exit_code == 0
    (user / "copy").rename(old)
    (old / "model" / "model.onnx.data").unlink()
    assert remove_stale_siblings(out) == [old]


# --------------------------------------------------------------------------- single files


def _is_golden(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("kind") == "l4"
    except ValueError:
        return False


def test_output_files_never_overwrite_what_is_not_ours(tmp_path: Path) -> None:
    ours = tmp_path / "case.l4.json"
    ours.write_text(json.dumps({"kind": "l4"}))
    write_file(ours, b'{"kind": "l4", "new": 1}', is_ours=_is_golden, what="golden file")
    assert json.loads(ours.read_text())["new"] == 1
    theirs = tmp_path / "other.l4.json"
    theirs.write_text("my own file")
    link = tmp_path / "link.l4.json"
    link.symlink_to(ours)
    folder = tmp_path / "dir.l4.json"
    folder.mkdir()
    before = snapshot(tmp_path)
    cases = [
        (theirs, "is not a golden file"),
        (link, "symbolic link"),
        (folder, "is not a file"),
        (theirs / "x.json", "is a file, not a folder"),
    ]
    for path, needle in cases:
        with pytest.raises(PackageError, match=needle):
            write_file(path, b"{}", is_ours=_is_golden, what="golden file")
        with pytest.raises(PackageError, match=needle):
            check_output_file(path, is_ours=_is_golden, what="golden file")
    assert snapshot(tmp_path) == before


def test_a_parent_without_write_permission_is_a_one_line_error(
    tiny_host, user: Path, monkeypatch
) -> None:
    """As a non-root user in a read-only folder (simulated: the tests may run as root)."""
    import mobius.outdir

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(mobius.outdir.tempfile, "mkdtemp", denied)
    before = snapshot(user)
    error = assert_refused(
        build(tiny_host, user / "ckpt", user / "out"), "cannot create a folder", "denied"
    )
    assert f"where: {user}" in error
    assert snapshot(user) == before


# --------------------------------------------------------------------------- a package's own files


def on_rename_of(path: Path, action, monkeypatch) -> None:
    """Run ``action()`` just before :mod:`mobius.outdir` renames ``path`` (a race, a failure)."""
    import mobius.outdir

    rename = os.rename

    def hooked(src, dst):
        if Path(src) == path:
            action()
        rename(src, dst)

    monkeypatch.setattr(mobius.outdir.os, "rename", hooked)


@pytest.mark.parametrize("name", ["tinytest.txt", "model/model.onnx", MANIFEST_NAME + "x"])
def test_a_package_file_the_user_changed_is_not_replaced(tiny_host, user: Path, name) -> None:
    """A listed file that no longer matches its pin (edited by hand) is the user's now."""
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    changed = out / name
    if changed.exists():
        size = changed.stat().st_size  # same size, other bytes: the sha256 tells them apart
        changed.write_bytes(b"#" * size)
    else:  # a file the user added beside the manifest
        changed.write_text("my own")
    before = snapshot(user)
    result = build(tiny_host, user / "ckpt", out, "--force")
    assert_refused(result, "not the package's as built", name)
    assert snapshot(user) == before


def test_a_hand_made_manifest_cannot_claim_the_user_files(tiny_host, user: Path) -> None:
    """A mobius.json listing files without pins (or with ``../``) makes nothing deletable."""
    out = user / "work"  # the user's folder: thesis.tex
    manifest = {
        "format_version": 1,
        "components": {"m": {"path": "thesis.tex"}, "n": {"path": "../notes.txt"}},
        "files": {"thesis.tex": {}, "../notes.txt": {"sha256": "0" * 64, "size": 8}},
    }
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    before = snapshot(user)
    result = build(tiny_host, user / "ckpt", out, "--force")
    assert_refused(result, "not the package's as built", "thesis.tex")
    assert snapshot(user) == before


def test_a_file_written_into_out_during_the_swap_is_kept(
    tiny_host, user: Path, monkeypatch
) -> None:
    """The race: OUT passed the last check, then a file lands in it before the rename."""
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    on_rename_of(out, lambda: (out / "late.txt").write_text("written during the swap"), monkeypatch)
    result = build(tiny_host, user / "ckpt", out, "--force")
    monkeypatch.undo()
    assert result.exit_code == 0, (result.output, result.exception)
    assert verify_package(out) == []
    kept = [p for p in user.iterdir() if ".out.mobius-old-" in p.name]
    assert len(kept) == 1 and (kept[0] / "late.txt").read_text() == "written during the swap"
    assert f"kept {kept[0]}: it still holds late.txt" in result.stderr


def test_an_old_package_that_cannot_be_removed_is_kept_and_named(
    tiny_host, user: Path, monkeypatch
) -> None:
    """A read-only old package: the new one is in place, exit 0, no traceback; later
    builds step over the leftover instead of failing on it."""
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    unlink = Path.unlink

    def read_only(self, missing_ok=False):
        if ".mobius-old-" in str(self):
            raise PermissionError(1, "Operation not permitted", str(self))
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", read_only)
    result = build(tiny_host, user / "ckpt", out, "--force")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "Traceback" not in result.output and verify_package(out) == []
    (kept,) = [p for p in user.iterdir() if ".out.mobius-old-" in p.name]
    assert f"kept {kept}" in result.stderr
    stale = kept.with_name(f".out.mobius-old-{dead_pid()}-1234abcd")
    kept.rename(stale)  # as if left by a build that has since exited
    notices: list[str] = []
    assert remove_stale_siblings(out, notice=notices.append) == []
    assert stale.is_dir() and any(f"kept {stale}" in n for n in notices)
    monkeypatch.undo()
    assert remove_stale_siblings(out) == [stale]


def test_a_user_file_named_like_the_stamp_is_never_overwritten(tiny_host, user: Path) -> None:
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    mine = out / ".mobius-verified.json"
    mine.write_text("my own notes, not a stamp")
    assert verify_package(out) == []  # verify refreshes stamps, but this is not one
    assert mine.read_text() == "my own notes, not a stamp"
    before = snapshot(user)
    result = build(tiny_host, user / "ckpt", out, "--force")
    assert_refused(result, "not the package's as built", ".mobius-verified.json")
    assert snapshot(user) == before


def test_a_deleted_current_folder_is_a_one_line_error(tiny_host, user: Path, monkeypatch) -> None:
    gone = user / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    before = snapshot(user)
    error = assert_refused(
        build(tiny_host, user / "ckpt", "out"), "current folder no longer exists"
    )
    assert "where: out" in error
    assert snapshot(user) == before
    result = build(tiny_host, user / "ckpt", user / "out")  # absolute paths still work
    assert result.exit_code == 0, (result.output, result.exception)
    assert verify_package(user / "out") == []


def test_a_mount_point_out_is_refused_before_the_build(tiny_host, user: Path, monkeypatch) -> None:
    """A volume mounted at OUT (docker -v): renaming it fails with EBUSY, so refuse up front."""
    import mobius.outdir

    out = user / "out"
    out.mkdir()
    ismount = os.path.ismount
    monkeypatch.setattr(mobius.outdir.os.path, "ismount", lambda p: Path(p) == out or ismount(p))
    before = snapshot(user)
    error = assert_refused(build(tiny_host, user / "ckpt", out, "--force"), "is a mount point")
    assert f"{out}/MODEL" in error
    assert snapshot(user) == before


def test_an_out_that_cannot_be_moved_aside_is_a_one_line_error(
    tiny_host, user: Path, monkeypatch
) -> None:
    """The swap's first rename fails (EBUSY, EXDEV...): nothing replaced, no traceback."""
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0

    def busy() -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    on_rename_of(out, busy, monkeypatch)
    before = snapshot(user)
    assert_refused(build(tiny_host, user / "ckpt", out, "--force"), "cannot be moved aside", "busy")
    assert snapshot(user) == before  # the old package as it was, no temporary sibling left


def test_a_package_that_appears_during_a_build_without_force_is_kept(
    tiny_host, user: Path, monkeypatch
) -> None:
    """Two builds into one new OUT: the one that finishes second, without --force, refuses."""
    import shutil

    import mobius.outdir

    assert build(tiny_host, user / "ckpt", user / "first").exit_code == 0
    out = user / "out"
    make_temp_sibling = mobius.outdir.make_temp_sibling

    def other_build_finishes_first(target: Path) -> Path:
        shutil.copytree(user / "first", out)
        return make_temp_sibling(target)

    monkeypatch.setattr(mobius.outdir, "make_temp_sibling", other_build_finishes_first)
    result = build(tiny_host, user / "ckpt", out)
    assert_refused(result, "a mobius package appeared at the output folder")
    monkeypatch.undo()
    assert snapshot(out) == snapshot(user / "first")
    assert not [p for p in user.iterdir() if ".mobius-" in p.name]


def test_a_stamp_left_half_written_by_a_killed_verify_is_the_package_s(
    tiny_host, user: Path
) -> None:
    out = user / "out"
    assert build(tiny_host, user / "ckpt", out).exit_code == 0
    (out / ".mobius-verified.json.4242-0123abcd.tmp").write_text('{"stamp_ver')
    result = build(tiny_host, user / "ckpt", out, "--force")
    assert result.exit_code == 0, (result.output, result.exception)
    assert verify_package(out) == [] and not list(out.glob("*.tmp"))
