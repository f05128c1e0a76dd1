"""Where a command may write: the one policy for output folders and output files.

Every command that writes goes through this module (``mobius build`` and
:func:`mobius.package.write_package` for package folders, ``mobius golden regen``
for golden files), so "nothing of the user's is ever deleted or overwritten" is
decided in one place.

A package folder OUT may be written when it does not exist or is an empty
folder; with ``force`` it may also *replace* a previous mobius package (a folder
whose ``mobius.json`` says it is one and that holds nothing the manifest does
not list). Always refused, with or without ``force``, nothing touched:

- OUT that is a symbolic link (dangling or not), or whose last part is ``..``;
- OUT that is a mount point (the swap renames OUT, which a mount point refuses);
- OUT under a path part that is a file (``file.txt/out``);
- OUT equal to or a parent of the current folder or the home folder;
- OUT equal to, inside, or a parent of a source (the checkpoint);
- OUT that is a file, a non-empty folder that is not a package, or a package
  holding anything that is not the package's own file (see below).

A file is the package's own when its ``mobius.json`` lists it with the sha256
and size the writer pins, and the file still has that size and (up to
:data:`HASH_LIMIT` bytes) that sha256. A user's notes, a tokenizer edited by hand,
a symbolic link, or a file a hostile ``mobius.json`` lists without a pin are not,
so ``--force`` refuses to replace the folder. Removing a package deletes only its
own files and then its emptied folders (``rmdir``, never a recursive delete), so a
file that appears in it between the check and the removal is kept, and named.

Replacing is atomic: the new package is assembled in a hidden sibling
``.{OUT}.mobius-tmp-{pid}-{rand}`` and only then swapped in; the previous one is
moved to ``.{OUT}.mobius-old-{pid}-{rand}`` for the instant of the swap and then
removed. A process killed outright (SIGKILL, power loss) cannot clean up, so the
next write to the same OUT looks at siblings whose pid no longer runs:

- a ``tmp`` sibling is scratch and is removed;
- an ``old`` sibling while OUT is missing holds the only copy of the previous
  OUT (the kill fell between the two renames): it is renamed back to OUT;
- an ``old`` sibling while OUT exists is a superseded package: removed when it
  is one (or empty), a symbolic link is unlinked (its target is not touched),
  anything else is kept and named.

Folders are created following the umask (``tempfile.mkdtemp`` alone makes 0700).
A single output *file* (a golden) may be written when nothing is there or when
the file there is one the command wrote before (the caller says how to tell),
never through a symbolic link; it is written to a temporary sibling and renamed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

from mobius.errors import PackageError

MANIFEST_NAME = "mobius.json"
"""The manifest file that marks a folder as a mobius package (``mobius.package`` writes it)."""
TEMP_KINDS = ("tmp", "old")
"""Sibling folders the writer makes: ``tmp`` (being assembled), ``old`` (replaced by --force)."""
_SHOWN = 5
"""How many unexpected files an error names."""
HASH_LIMIT = 64 * 1024 * 1024
"""Files up to this size must match their pinned sha256 to count as a package's own;
larger ones (external weights) their pinned size. Bounds the time a --force check takes."""

Notice = Callable[[str], None]


# --------------------------------------------------------------------------- what a folder is


Pin = tuple[object, object]
"""What a manifest pins for one file: (sha256, size), as written (checked by :func:`_own`)."""


def package_pins(folder: Path) -> dict[str, Pin | None] | None:
    """What a package's manifest pins, by relative path (None for the manifest and the
    verification stamp, which pin nothing), or None if ``folder`` holds no
    ``mobius.json`` that says it is a mobius package.

    Only the manifest's schema is checked (an integer ``format_version`` of any
    version, :func:`mobius.package.manifest.manifest_problems`), not hashes: this
    decides what a folder *is*; :func:`_own` whether a file in it is the package's,
    :func:`mobius.package.verify_package` whether the package is intact.
    """
    manifest_path = folder / MANIFEST_NAME
    try:
        if manifest_path.is_symlink() or not manifest_path.is_file():
            return None
    except OSError:
        return None
    # here, not at the top: mobius.package imports this module
    from mobius.package.checks import pinned_files
    from mobius.package.content import MAX_MANIFEST_BYTES, load_json
    from mobius.package.manifest import manifest_problems
    from mobius.package.stamp import STAMP_NAME

    try:
        manifest = load_json(manifest_path, MANIFEST_NAME, "", max_bytes=MAX_MANIFEST_BYTES)
    except PackageError:
        return None
    if (
        not isinstance(manifest, dict)
        or type(manifest.get("format_version")) is not int  # any version: replaceable
        or manifest_problems(manifest)
    ):
        return None
    pins: dict[str, Pin | None] = {MANIFEST_NAME: None, STAMP_NAME: None}
    for pin in pinned_files(manifest):
        pins.setdefault(_norm(pin.rel), (pin.sha256, pin.size))
    return pins


def _norm(rel: str) -> str:
    return PurePosixPath(rel.replace("\\", "/")).as_posix()


def _own(path: Path, rel: str, pins: dict[str, Pin | None]) -> bool:
    """Whether the file ``path`` (``rel`` in its package) is the package's own, as built."""
    from mobius.package.stamp import STAMP_NAME, TMP_NAME, is_stamp

    if TMP_NAME.fullmatch(rel):  # a stamp being written when mobius verify was killed
        return path.is_file() and not path.is_symlink()
    if rel not in pins or path.is_symlink():
        return False
    if rel == MANIFEST_NAME:
        return True
    if rel == STAMP_NAME:
        return is_stamp(path)
    sha, size = pins[rel] or (None, None)
    if not isinstance(sha, str) or type(size) is not int:
        return False  # the writer pins every file; an unpinned listing claims a stranger's
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            return False
        if size > HASH_LIMIT:
            return True
        from mobius.package.manifest import _sha256_size

        return _sha256_size(path)[0] == sha
    except OSError:
        return False


def foreign_files(folder: Path, pins: dict[str, Pin | None]) -> list[str]:
    """Everything under ``folder`` that is not a folder and not the package's own file."""
    extra: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        base = Path(dirpath)
        for name in filenames + [d for d in dirnames if (base / d).is_symlink()]:
            path = base / name
            rel = path.relative_to(folder).as_posix()
            if not _own(path, rel, pins):
                extra.append(rel)
    return sorted(extra)


def _is_empty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _shown(names: list[str]) -> str:
    text = ", ".join(names[:_SHOWN])
    return text + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


# --------------------------------------------------------------------------- the policy


def check_package_out(
    out: str | os.PathLike[str],
    *,
    force: bool,
    sources: Iterable[str | os.PathLike[str]] = (),
    notice: Notice | None = None,
) -> Path:
    """Refuse an OUT this policy does not allow (see the module doc); return it absolute.

    ``sources`` are local inputs (the checkpoint folder) OUT must stay clear of.
    Before looking at OUT, an interrupted replacement is undone (see
    :func:`recover_interrupted`: a rename back, nothing deleted); ``notice`` is told
    when that happens. Raises
    :class:`~mobius.errors.PackageError`; touches nothing of the user's.
    """
    raw = os.fspath(out)
    if not raw.strip():
        raise PackageError(
            "the output folder is an empty string", where="OUT", fix="name a folder to write to"
        )
    path = Path(raw).expanduser()
    where = str(path)
    if path.name == "..":
        raise PackageError(
            "the output folder ends in '..', which names a parent folder by another name",
            where=where,
            fix=f"name the folder itself, e.g. "
            f"{os.path.normpath(_absolute(path, where))}/NEW-FOLDER",
        )
    path = _absolute(path, where)
    _check_ancestors(path, where)
    recover_interrupted(path, notice=notice)
    if path.is_symlink():
        raise PackageError(
            f"the output folder is a symbolic link (to {os.readlink(path)})",
            where=where,
            fix="pass the real folder, or a new folder name, not a link",
        )
    real = path.resolve()
    for label, guarded in _guarded_folders():
        if real == guarded or real in guarded.parents:
            what = "is" if real == guarded else "is a parent of"
            raise PackageError(
                f"the output folder {what} the {label} ({guarded})",
                where=where,
                fix="write the package to a new folder of its own, e.g. ./out/MODEL",
            )
    for source in sources:
        src = _absolute(Path(source).expanduser(), os.fspath(source)).resolve()
        relation = _relation(real, src)
        if relation:
            raise PackageError(
                f"the output folder {relation} the source checkpoint ({src})",
                where=where,
                fix="write the package to a folder outside the checkpoint, e.g. ./out/MODEL",
            )
    if os.path.ismount(path):
        raise PackageError(
            "the output folder is a mount point; a package is assembled beside OUT and renamed "
            "into place, which a mount point does not allow",
            where=where,
            fix=f"write the package to a new folder inside it, e.g. {path}/MODEL",
        )
    _check_contents(path, where, force)
    return path


def _absolute(path: Path, where: str) -> Path:
    """``path`` made absolute; PackageError when it is relative and the current folder is gone."""
    if path.is_absolute():
        return path
    try:
        return path.absolute()
    except OSError as exc:  # os.getcwd(): the current folder was deleted or moved away
        raise PackageError(
            f"the current folder no longer exists ({exc.strerror or exc}), so the relative "
            "path cannot be placed",
            where=where,
            fix="cd into an existing folder, or pass absolute paths",
        ) from exc


def _guarded_folders() -> list[tuple[str, Path]]:
    guarded = []
    with contextlib.suppress(OSError):  # a deleted current folder guards nothing
        guarded.append(("current folder", Path.cwd().resolve()))
    with contextlib.suppress(KeyError, RuntimeError, OSError):  # no HOME, no passwd entry
        guarded.append(("home folder", Path.home().resolve()))
    return guarded


def _relation(out: Path, source: Path) -> str | None:
    if out == source:
        return "is"
    if source in out.parents:
        return "is inside"
    if out in source.parents:
        return "is a parent of"
    return None


def _check_ancestors(path: Path, where: str) -> None:
    """Refuse when a part of OUT's parent path exists and is not a folder."""
    for parent in path.parents:
        if os.path.lexists(parent):
            if not parent.is_dir():
                kind = "a dangling symbolic link" if parent.is_symlink() else "a file"
                raise PackageError(
                    f"{parent} is {kind}, not a folder, so the output folder cannot be made in it",
                    where=where,
                    fix="choose an output path whose parent folders are folders",
                )
            return


def _check_contents(path: Path, where: str, force: bool) -> None:
    if not os.path.lexists(path):
        return
    if not path.is_dir():
        raise PackageError(
            "the output path exists and is a file, not a folder",
            where=where,
            fix="choose another output folder (a file is never replaced)",
        )
    if _is_empty_dir(path):
        return
    pins = package_pins(path)
    if pins is None:
        raise PackageError(
            f"the output folder is not empty and is not a mobius package (no valid "
            f"{MANIFEST_NAME}); --force replaces only a previous package or an empty folder",
            where=where,
            fix="choose a new folder, or empty this one yourself",
        )
    extra = foreign_files(path, pins)
    if extra:
        raise PackageError(
            f"the output folder holds a mobius package and {len(extra)} file(s) that are not "
            f"the package's as built ({_shown(extra)}: not pinned by its {MANIFEST_NAME}, "
            "changed since, or links); --force would delete them",
            where=where,
            fix="move those files out, or choose a new folder",
        )
    if not force:
        raise PackageError(
            "the output folder already holds a mobius package",
            where=where,
            fix="pass --force to replace it, or choose another folder",
        )


# --------------------------------------------------------------------------- siblings


def sibling_prefix(out: Path, kind: str) -> str:
    """Name prefix of this process's ``kind`` (tmp/old) siblings of ``out``."""
    return f".{out.name}.mobius-{kind}-{os.getpid()}-"


def _sibling_pattern(out: Path, kind: str) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(out.name)}\.mobius-{kind}-(\d+)-[^/\\]+")


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this machine's pid namespace).

    On Windows ``os.kill(pid, 0)`` would terminate the process, so every pid
    counts as alive there (stale folders are then left for the user to delete).
    """
    if os.name == "nt":
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def _dead_siblings(out: Path, kind: str) -> list[Path]:
    """``kind`` siblings of ``out`` whose writer no longer runs, newest first."""
    pattern = _sibling_pattern(out, kind)
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return []
    found = []
    for sibling in entries:
        match = pattern.fullmatch(sibling.name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and not _pid_alive(pid):
            found.append(sibling)

    def mtime(p: Path) -> float:
        try:
            return p.lstat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=mtime, reverse=True)


def recover_interrupted(
    out: str | os.PathLike[str], *, notice: Notice | None = None
) -> Path | None:
    """When OUT is missing and a dead writer's ``old`` sibling exists, rename it back.

    Why: a replacement killed between its two renames leaves the previous OUT only
    in that sibling. Returns the sibling restored, if any.
    """
    out = Path(out).absolute()
    if os.path.lexists(out):
        return None
    for sibling in _dead_siblings(out, "old"):
        if not (sibling.is_dir() or sibling.is_symlink()):
            continue
        try:
            os.rename(sibling, out)
        except OSError:
            continue
        if notice is not None:
            notice(f"restored {out} from {sibling.name}, left by an interrupted build")
        return sibling
    return None


def remove_stale_siblings(
    out: str | os.PathLike[str], *, notice: Notice | None = None
) -> list[Path]:
    """Remove siblings of ``out`` left by writers that no longer run; return them.

    Why: a writer killed outright (SIGKILL, OOM killer) cannot clean up after
    itself. Only folders whose name carries a pid that is gone are looked at; a
    live writer's folders (another process, or this one) are left alone. The pid
    is checked in this machine's process table, so two machines writing into one
    shared folder at once must not use the same OUT. ``old`` siblings are first
    offered to :func:`recover_interrupted`; one is removed only while OUT exists
    and only when it is a package (or empty), never when it may hold user data.
    """
    out = Path(out).absolute()
    recover_interrupted(out, notice=notice)
    removed: list[Path] = []
    for sibling in _dead_siblings(out, "tmp"):
        if sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)
            if not os.path.lexists(sibling):
                removed.append(sibling)
    if not os.path.lexists(out):
        return removed
    for sibling in _dead_siblings(out, "old"):
        if sibling.is_symlink():
            with contextlib.suppress(OSError):
                sibling.unlink()  # the link only; what it points to is not touched
        elif not sibling.is_dir():
            continue
        elif _is_empty_dir(sibling) or _is_pure_package(sibling):
            _kept_notice(sibling, remove_package(sibling), notice)
        else:
            if notice is not None:
                notice(
                    f"kept {sibling}: left by an interrupted build, it holds files that are "
                    "not a mobius package's; look inside, then delete it yourself"
                )
            continue
        if not os.path.lexists(sibling):
            removed.append(sibling)
    return removed


def _is_pure_package(folder: Path) -> bool:
    pins = package_pins(folder)
    return pins is not None and not foreign_files(folder, pins)


def remove_package(folder: Path) -> list[str]:
    """Delete a package folder's own files, then its emptied folders; return what is left.

    Only files :func:`_own` accepts are deleted, folders only with ``rmdir`` (so
    never one that holds anything else), the manifest last and only when nothing
    else is left. Never raises: a file that cannot be deleted (permissions, a
    read-only file system) or one that is not the package's (written into the
    folder after it was checked) is left where it is, and returned.

    Why the manifest last: if this is interrupted, what is left still says it is a
    package (with files missing), so a later :func:`remove_stale_siblings` removes
    it instead of keeping it as possible user data.
    """
    pins = package_pins(folder) or {}
    left: list[str] = []
    manifest = folder / MANIFEST_NAME
    for dirpath, dirnames, filenames in os.walk(folder, topdown=False, followlinks=False):
        base = Path(dirpath)
        for name in filenames + [d for d in dirnames if (base / d).is_symlink()]:
            path = base / name
            rel = path.relative_to(folder).as_posix()
            if path == manifest:
                continue
            if _own(path, rel, pins):
                with contextlib.suppress(OSError):
                    path.unlink()
            if os.path.lexists(path):
                left.append(rel)
        if base != folder:
            with contextlib.suppress(OSError):
                base.rmdir()
    if not left:
        with contextlib.suppress(OSError):
            manifest.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()
    if os.path.lexists(folder) and not left:
        left.append(MANIFEST_NAME if os.path.lexists(manifest) else ".")
    return sorted(left)


def _kept_notice(folder: Path, left: list[str], notice: Notice | None) -> None:
    if left and notice is not None:
        notice(
            f"kept {folder}: it still holds {_shown(left)}, not removable or not the previous "
            "package's own files; look inside, then delete it yourself"
        )


# --------------------------------------------------------------------------- writing


_umask_lock = threading.Lock()


def umask() -> int:
    """This process's umask (read without changing it where the system allows)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def make_parent(out: Path) -> None:
    """Create OUT's parent folders (following the umask); PackageError when that fails."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PackageError(
            f"cannot create the output folder's parent: {exc.strerror or exc}",
            where=str(out.parent),
            fix="check the path and your permissions there, or choose another OUT",
        ) from exc


def make_temp_sibling(out: Path) -> Path:
    """A new, empty ``tmp`` sibling of ``out``, with the mode a plain mkdir would give.

    A full disk propagates as the OSError it is (the writer names it); any other
    failure (no permission to write in OUT's parent) is a PackageError.
    """
    try:
        tmp = Path(tempfile.mkdtemp(prefix=sibling_prefix(out, "tmp"), dir=out.parent))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        raise PackageError(
            f"cannot create a folder next to the output folder: {exc.strerror or exc}",
            where=str(out.parent),
            fix="check your permissions there, or choose another OUT",
        ) from exc
    os.chmod(tmp, 0o777 & ~umask())
    return tmp


def move_into_place(
    tmp: Path, out: Path, notice: Notice | None = None, *, force: bool = False
) -> None:
    """Put the finished folder ``tmp`` at ``out``, replacing what the policy allowed there.

    What is at OUT is checked again right before the swap (a file may have been
    added since :func:`check_package_out`): only an empty folder or a package
    holding only its own files is replaced. The previous OUT is removed only after
    the new one is in place, by :func:`remove_package`, which deletes only the
    package's own files: anything written into OUT in the instant between the
    check and the swap is kept in the ``old`` sibling, and ``notice`` names it.
    Without ``force``, a package that appeared at OUT during the build (another
    build finished first) is not replaced either.
    """
    changed = PackageError(
        "the output folder changed during the build and no longer holds only a package",
        where=str(out),
        fix="nothing was replaced; check the folder and build again",
    )
    if not os.path.lexists(out):
        try:
            os.rename(tmp, out)  # fails (ENOTEMPTY) if a folder with files appeared just now
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) or not os.path.lexists(out):
                raise
            raise changed from exc
        return
    if out.is_symlink() or not out.is_dir() or not (_is_empty_dir(out) or _is_pure_package(out)):
        raise changed
    if not force and not _is_empty_dir(out):
        raise PackageError(
            "a mobius package appeared at the output folder during the build (another build?)",
            where=str(out),
            fix="nothing was replaced; pass --force to replace it, or choose another folder",
        )
    old = out.parent / f"{sibling_prefix(out, 'old')}{uuid.uuid4().hex[:8]}"
    try:
        os.rename(out, old)
    except OSError as exc:  # EBUSY (a mount point), EXDEV, EPERM (sticky or immutable)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise PackageError(
            f"the output folder cannot be moved aside to be replaced: {exc.strerror or exc}; "
            "nothing was replaced",
            where=str(out),
            fix=f"write the package to a new folder, e.g. {out}/MODEL or a sibling of OUT",
        ) from exc
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    _kept_notice(old, remove_package(old), notice)


def check_output_file(
    path: str | os.PathLike[str], *, is_ours: Callable[[Path], bool], what: str
) -> Path:
    """Refuse to write ``path`` when that would overwrite something not ``is_ours``.

    Refused: a symbolic link, a folder, a file that ``is_ours`` rejects, or a
    parent path part that is a file. ``what`` names the kind of file in errors.
    """
    path = Path(path).expanduser().absolute()
    where = str(path)
    if path.is_symlink():
        raise PackageError(
            f"the {what} path is a symbolic link (to {os.readlink(path)})",
            where=where,
            fix="remove the link or choose another folder; links are never written through",
        )
    _check_ancestors(path, where)
    if path.exists():
        if not path.is_file():
            raise PackageError(
                f"the {what} path exists and is not a file",
                where=where,
                fix="move it away or choose another folder",
            )
        if not is_ours(path):
            raise PackageError(
                f"a file that is not a {what} is in the way",
                where=where,
                fix="move it away or choose another folder; it is never overwritten",
            )
    return path


def write_file(
    path: str | os.PathLike[str], data: bytes, *, is_ours: Callable[[Path], bool], what: str
) -> Path:
    """Write ``data`` to ``path`` atomically, after :func:`check_output_file`."""
    path = check_output_file(path, is_ours=is_ours, what=what)
    make_parent(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".mobius-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp_name, 0o666 & ~umask())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
