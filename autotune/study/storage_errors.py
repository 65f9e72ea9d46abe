"""A storage failing under a command, told in one line that names it: a full disk, the file
size limit (`ulimit -f`), a lock another process holds, a file that is no readable database.

The cause sits somewhere in a chain: Optuna wraps SQLAlchemy's errors (`StorageInternalError`,
whatever went wrong), SQLAlchemy wraps the driver's (`sqlite3.OperationalError`), and an error
raised while Optuna handles another (its final record of a trial) keeps the first only in
`__context__`. `storage_error` reads the whole chain and the driver's own error code, never
Optuna's wording. Torch-free.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sqlite3
from pathlib import Path
from typing import Iterator

from autotune import environment
from autotune.device.disk import MIN_FREE_BYTES, free_bytes
from autotune.errors import AutotuneError
from autotune.study.urls import parse_storage_url, redact
from autotune.units import format_bytes

FULL = "full"  # no room left: the disk, a quota, the database server's disk
SIZE_LIMIT = "size limit"  # the file reached RLIMIT_FSIZE (ulimit -f)
LOCKED = "locked"  # another process holds the database's lock
DAMAGED = "damaged"  # the file is no readable database (bad input: exit 2)
IO = "io"  # the disk failed to read or write it

PG_DISK_FULL = "53100"  # PostgreSQL's disk_full


class StorageError(AutotuneError):
    """A storage that cannot be read or written, in one line naming it; `kind` says why (one of
    the names above). A damaged file is bad input (exit 2); the others stop a command (exit 1)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = 2 if kind == DAMAGED else 1


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception behind it (`__cause__`, `__context__`), each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(c for c in (current.__cause__, current.__context__) if c is not None)


def storage_error(exc: BaseException, url: str, *, waited_s: float | None = None) -> StorageError | None:
    """The StorageError behind `exc` for the storage at `url`: one already made, or one made from
    the database driver's error; None when no storage failure is behind it. `waited_s`: how long
    a lock is waited for (AUTOTUNE_LOCK_WAIT_S), said in the message."""
    for cause in causes(exc):
        if isinstance(cause, StorageError):
            return cause
        if isinstance(cause, json.JSONDecodeError):  # a stored value edited by hand or torn
            return StorageError(
                f"storage {redact(url)}: a stored value is not JSON ({cause}): the study is damaged; restore it from a "
                "backup",
                DAMAGED,
            )
        made = _from_driver(cause, url, waited_s)
        if made is not None:
            return made
    return None


def file_storage_error(exc: OSError, url: str) -> StorageError | None:
    """An OSError of a storage's own file (a journal) as a StorageError; None for other errors."""
    kind = {errno.ENOSPC: FULL, errno.EDQUOT: FULL, errno.EFBIG: SIZE_LIMIT, errno.EIO: IO}.get(exc.errno or 0)
    return None if kind is None else _error(kind, url, exc.strerror or str(exc))


def _from_driver(exc: BaseException, url: str, waited_s: float | None) -> StorageError | None:
    if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) is not None:
        primary = exc.sqlite_errorcode & 0xFF  # an extended code's low byte is its primary code
        kind = {
            sqlite3.SQLITE_FULL: FULL,
            sqlite3.SQLITE_BUSY: LOCKED,
            sqlite3.SQLITE_LOCKED: LOCKED,
            sqlite3.SQLITE_CORRUPT: DAMAGED,
            sqlite3.SQLITE_NOTADB: DAMAGED,
            sqlite3.SQLITE_IOERR: IO,
        }.get(primary)
        if kind == IO:
            kind = _why_io_failed(url)
        return None if kind is None else _error(kind, url, str(exc), waited_s)
    if getattr(exc, "pgcode", None) == PG_DISK_FULL:  # psycopg2's and psycopg's errors carry it
        return _error(FULL, url, str(exc).strip().splitlines()[0] if str(exc).strip() else "disk full")
    return None


def _why_io_failed(url: str) -> str:
    """SQLite reports a write past RLIMIT_FSIZE (EFBIG), and some writes to a full disk, as a
    plain I/O error: the file's size and the disk's free space tell which it was."""
    path = parse_storage_url(url).path
    if path is None:
        return IO
    if _size_limit() is not None and _largest_size(path) + (64 << 10) >= _size_limit():
        return SIZE_LIMIT
    free = free_bytes(path.parent)
    return FULL if free is not None and free < MIN_FREE_BYTES else IO


def _size_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def _largest_size(path: Path) -> int:
    """The largest of the database and the journal SQLite writes beside it."""
    sizes = []
    for candidate in (path, path.with_name(path.name + "-journal"), path.with_name(path.name + "-wal")):
        try:
            sizes.append(os.path.getsize(candidate))
        except OSError:
            continue
    return max(sizes, default=0)


def _error(kind: str, url: str, detail: str, waited_s: float | None = None) -> StorageError:
    shown, path = redact(url), parse_storage_url(url).path
    detail = detail.strip().splitlines()[0] if detail.strip() else kind
    if kind == FULL:
        where = f"the disk holding {path} is full" if path is not None else "the database server's disk is full"
        return StorageError(f"storage {shown}: {where} ({detail})", kind)
    if kind == SIZE_LIMIT:
        limit = _size_limit()
        what = f"the file size limit ({format_bytes(limit)}, ulimit -f)" if limit is not None else "the file size limit"
        return StorageError(f"storage {shown}: {path} reached {what} ({detail}); raise the limit", kind)
    if kind == LOCKED:
        waited = f"; waited {waited_s:g} s, {environment.LOCK_WAIT_S}" if waited_s is not None else ""
        return StorageError(
            f"storage {shown}: the database is locked by another process ({detail}{waited}); close what holds it "
            "(a sqlite3 shell, a backup, another tuner)",
            kind,
        )
    if kind == DAMAGED:
        name = path if path is not None else "it"
        return StorageError(
            f"storage {shown}: {name} is not a readable SQLite database ({detail}): restore it from a backup", kind
        )
    return StorageError(f"storage {shown}: the disk failed to read or write it ({detail})", kind)
