"""Journal files that tolerate a torn tail.

A writer killed mid-append (kill -9, a full disk, a power cut) leaves a last record cut short;
Optuna skips it when reading, but the next append would glue a whole record to it and make the
file unreadable. Opening a journal sets such a tail aside first (`recover_journal`): the file is
cut back to its last whole record, the cut bytes are kept beside it as `PATH.torn-<time>`, and
the user is told. A file that an older autotune already appended to after a torn record is
repaired the same way, line by line.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

from optuna.storages.journal import JournalFileOpenLock

from autotune.errors import UsageError


def recover_journal(path: Path, *, writable: bool = True) -> str | None:
    """Make a journal file readable and safe to append to; returns what was done (for the user),
    or None when the file is whole. Holds the journal's own lock, so no writer appends meanwhile.

    A record cut short at the end (no newline: its writer died mid-write) is moved to
    `PATH.torn-<UTC time>` and the file cut back to its last whole record. A bad line inside
    the file (an older autotune appended after a torn record, gluing the two) is split: the
    whole record that ends the line is kept, the torn bytes before it go to the backup. A line
    that is neither is not guessed at: UsageError, the file untouched. `writable=False`
    (reading a study): nothing is changed; a torn tail, which Optuna skips, is only reported.
    A file that holds no whole record at all is not a journal: UsageError, the file untouched."""
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        return None
    lines = data.split(b"\n")
    if not any(_whole_record(line) or _record_ending(line) is not None for line in lines):
        # Not a journal with a torn tail but some other file (a config.json given by mistake):
        # setting its content aside would destroy it. A journal whose only record was torn has
        # nothing to lose either, and moving it away is the user's call.
        raise UsageError(
            f"storage journal:{path}: is not a journal file (it holds no whole journal record); "
            "give a new or an existing journal's path (nothing was changed)"
        )
    tail = lines.pop()  # b"" when the file ends with a newline
    kept: list[bytes] = []
    torn: list[bytes] = []
    for number, line in enumerate(lines, start=1):
        if _whole_record(line):
            kept.append(line)
            continue
        whole = _record_ending(line)
        if whole is None:
            raise UsageError(
                f"storage journal:{path}: line {number} is not a journal record, and not a record cut "
                "short at the end either: autotune does not guess at it (restore the file from a backup)"
            )
        kept.append(line[len(line) - len(whole) :])
        torn.append(line[: len(line) - len(whole)])
    if tail and _whole_record(tail):  # a whole last record that lost only its newline
        kept.append(tail)
        tail = b""
    if tail:
        torn.append(tail)
    if not torn:
        return None
    size = sum(len(t) for t in torn)
    if not writable:
        if len(torn) == 1 and tail:
            return (
                f"journal {path}: its last record was cut short ({size} bytes, a writer stopped mid-write); "
                "it is skipped. The next `autotune search` on it sets those bytes aside"
            )
        raise UsageError(
            f"storage journal:{path}: records were glued to a torn one; run `autotune search` with this storage "
            "to repair it (the torn bytes are kept aside)"
        )
    lock = JournalFileOpenLock(str(path))
    lock.acquire()
    try:
        with open(path, "rb") as f:
            changed = f.read() != data  # someone appended meanwhile
        if not changed:
            backup = _set_aside(path, torn, kept)
    except OSError as exc:
        raise UsageError(f"storage journal:{path}: cannot repair its torn tail ({exc.strerror})") from None
    finally:
        lock.release()
    if changed:
        return recover_journal(path, writable=writable)
    return (
        f"journal {path}: {size} bytes of a record cut short (a writer stopped mid-write) were set aside in "
        f"{backup.name}; the study is read up to its last whole record"
    )


def _set_aside(path: Path, torn: list[bytes], kept: list[bytes]) -> Path:
    """Write the torn bytes to a new backup file, then replace the journal with its whole
    records (through a temporary file and a rename: a kill now loses nothing)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    backup = path.with_name(f"{path.name}.torn-{stamp}")
    with open(backup, "xb") as f:
        f.write(b"\n".join(torn))
        f.flush()
        os.fsync(f.fileno())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.repair")
    try:
        with open(tmp, "wb") as f:
            f.write(b"".join(line + b"\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return backup


def _whole_record(line: bytes) -> bool:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(record, dict) and "op_code" in record


def _record_ending(line: bytes) -> bytes | None:
    """The whole journal record that ends `line`, after torn bytes, if there is one."""
    start = line.find(b'{"op_code"', 1)
    while start != -1:
        if _whole_record(line[start:]):
            return line[start:]
        start = line.find(b'{"op_code"', start + 1)
    return None
