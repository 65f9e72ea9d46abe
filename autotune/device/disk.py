"""The host's disks: whether a file can be written where a run will write it, checked before
the run starts, and writing a file so that a kill or a full disk never leaves half of it.

A study that runs for an hour and then cannot write its recipe (a read-only folder, a full
disk, a path that names a folder) has wasted the hour: `check_writable` finds that first, and
writes nothing (its probe file is created and removed at once)."""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from pathlib import Path

from autotune.errors import AutotuneError, DiskFull, UsageError
from autotune.units import format_bytes

# A study's database grows by kilobytes a trial, a recipe is a few kilobytes: a disk with less
# free than this is full for practical purposes (and SQLite needs room for its journal).
MIN_FREE_BYTES = 16 << 20


# A write refused for want of room: the disk is full, or the user's quota on it is used up.
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# Python's words for an OSError: "[Errno 28] No space left on device: 'PATH'" (no path from write).
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\] ([^:\n]+)(?:: '([^'\n]*)')?")


def disk_full(exc: BaseException, where: str | Path | None = None) -> DiskFull | None:
    """`exc` as a DiskFull when it is an OSError for want of room (naming its file, else
    `where`); None for any other error."""
    if isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS:
        path = exc.filename if exc.filename is not None else where
        return DiskFull(None if path is None else str(path), exc.strerror or os.strerror(exc.errno))
    return None


def disk_full_in(text: str, where: str | Path | None = None) -> DiskFull | None:
    """The same, read from what a process printed or recorded (a trial's stderr, a crash's
    reason): Python's `[Errno 28] No space left on device: 'PATH'`, or the bare words C code
    prints (then `where`); None when the text says nothing of the kind."""
    for match in _ERRNO_TEXT.finditer(text):
        if int(match.group(1)) in FULL_DISK_ERRNOS:
            path = match.group(3) or (None if where is None else str(where))
            return DiskFull(path, match.group(2))
    for number in FULL_DISK_ERRNOS:
        if os.strerror(number) in text:
            return DiskFull(None if where is None else str(where), os.strerror(number))
    return None


def check_writable(path: str | Path, *, what: str, create_folders: bool = False, shown_as: str | None = None) -> None:
    """Refuse (UsageError, one line) a file that could not be written at `path`: it names a
    folder or a device, its folder is missing (unless `create_folders`: then the nearest
    existing one must take new folders), read-only or full. Nothing is left behind. Messages
    name it as "`what` `shown_as`" (default: the path)."""
    path = Path(path)
    shown = f"{what} {shown_as or path}"
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise UsageError(f"{shown}: cannot reach it ({_why(exc)})") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{shown}: is a folder; give a file name")
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{shown}: is not a regular file")
    folder = path.parent
    if not folder.is_dir():
        if not create_folders:
            raise UsageError(f"{shown}: the folder {folder} does not exist; create it first")
        folder = _nearest_existing(folder)
        if not folder.is_dir():
            raise UsageError(f"{shown}: {folder} is not a folder")
    _probe(folder, shown)
    if info is not None:
        try:  # opening for append changes nothing, and fails where writing would
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            raise UsageError(f"{shown}: cannot write it ({_why(exc)})") from None
    free = free_bytes(folder)
    if free is not None and free < MIN_FREE_BYTES:
        raise UsageError(
            f"{shown}: the disk of {folder} has {format_bytes(free)} free; autotune needs at least "
            f"{format_bytes(MIN_FREE_BYTES)} there"
        )


def free_bytes(folder: str | Path) -> int | None:
    """Bytes an unprivileged user may still write on the file system of `folder`."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def check_output_folder(folder: str | Path, names: tuple[str, ...] | list[str], *, what: str) -> Path:
    """Refuse (UsageError, one line) a folder that files `names` cannot be written into: it is
    a file, or one of the names there is a folder or other non-file. A symbolic link is fine:
    the files are written with `write_*_atomic`, whose rename replaces the link itself and never
    writes through it to its target. Nothing is created here."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{what} {folder}: is not a folder; give a folder to write into")
    for name in names:
        try:
            info = (folder / name).lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise UsageError(f"{what} {folder}: cannot reach {name} there ({_why(exc)})") from None
        if stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{what} {folder}: {name} there is a folder; remove it or give another folder")
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
            raise UsageError(f"{what} {folder}: {name} there is not a regular file; give another folder")
    return folder


def write_text_atomic(path: str | Path, text: str, *, what: str) -> Path:
    """Write `text` to `path` through a temporary file in the same folder and a rename: a
    reader sees the old file or the new one, never half of one. On any failure (a full disk,
    a read-only folder, a signal) the temporary file is removed and the old file is kept;
    the error is one line (AutotuneError, exit 1). Creates missing folders. A symbolic link at
    `path` is replaced, never written through."""
    return write_bytes_atomic(path, text.encode("utf-8"), what=what)


def write_bytes_atomic(path: str | Path, data: bytes, *, what: str) -> Path:
    """`write_text_atomic` for bytes (a PNG)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AutotuneError(f"{what} {path}: cannot create its folder ({_why(exc)})") from None
    # A name of its own per process: workers of one study may write the same file at once.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise AutotuneError(f"{what} {path}: cannot write it ({_why(exc)})") from None
        raise
    return path


def _nearest_existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _probe(folder: Path, shown: str) -> None:
    probe = folder / f".autotune-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(fd, b"autotune")
        finally:
            os.close(fd)
    except OSError as exc:
        raise UsageError(f"{shown}: cannot write in {folder} ({_why(exc)})") from None
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "the disk is full"
    return exc.strerror or type(exc).__name__
