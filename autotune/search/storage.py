"""Optuna storages from a URL, parsed strictly, with passwords kept out of every message.

    sqlite:///studies/NAME.db            the default: one file per study, one worker
    postgresql://user:pw@host/db         many workers on many hosts (heartbeats on)
    mysql://user:pw@host/db              the same, on MySQL
    journal:PATH                         Optuna's journal file: many workers on one host,
                                         no database server (JournalFileBackend)
    a bare PATH.db / PATH.journal        the same, for `compare` and `--warm-start-from`
    sqlite://                            in memory: gone when the process ends (no heartbeats)

Nothing else is a storage: a typo (`postgresql:/u:pw@host/db`, `notaurl`) is refused in one
line instead of becoming a SQLite file named after it. A password is hidden wherever a URL is
shown (`redact`, through SQLAlchemy's own URL parser, so what is hidden is what the driver
would send); a raw '@' inside a password is refused, because no parser can tell where such a
password ends (write it as %40). A storage file's folder must exist, except the default
`studies/`, which autotune creates. A study name is a plain name: it names a file.

A REF names one study: a storage and, when it holds more than one, `#NAME`
(`studies/gpt2-nvidia-a100.db`, `postgresql://tuner@db/autotune#gpt2-h200`).

Journal files tolerate a torn tail. A writer killed mid-append (kill -9, a full disk, a power
cut) leaves a last record cut short; Optuna skips it when reading, but the next append would
glue a whole record to it and make the file unreadable. Opening a journal sets such a tail
aside first (`recover_journal`): the file is cut back to its last whole record, the cut bytes
are kept beside it as `PATH.torn-<time>`, and the user is told. A file that an older autotune
already appended to after a torn record is repaired the same way, line by line.

Heartbeats (RDB storages): each worker's tuner records a heartbeat for its running trial
every AUTOTUNE_HEARTBEAT_S seconds (default 30) from a thread, whatever the trial is doing.
A trial whose heartbeat is older than GRACE_INTERVALS heartbeats (default 120 s) belongs to
a worker that is gone (killed, host lost): the next worker to start a trial fails it and
queues one retry. So a killed worker's trial is retried after the grace period plus, at
most, the length of one trial of a surviving worker. On one host `journal:` has no
heartbeats; there `study.fail_orphaned_trials` fails a dead tuner's trial at resume.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import importlib.util
import json
import logging
import os
import random
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote, quote_plus, unquote

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

from autotune.device.disk import check_writable
from autotune.errors import UsageError

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 30
HEARTBEAT_ENV = "AUTOTUNE_HEARTBEAT_S"
# A heartbeat comes from a thread of the tuner, not from the trial, so the grace period does
# not depend on the trial's length: a few missed beats (a busy database, a slow host) are
# tolerated, a dead worker is not.
GRACE_INTERVALS = 4
# User attrs a retried trial keeps: where its configuration came from. The rest (host, pids,
# outcome of the dead attempt) describe the attempt, and a stale tuner_pid on a running retry
# would make it look orphaned.
RETRY_KEEPS = ("reference", "warm_start_from", "warm_start_trial")
STUDIES_DIR = Path("studies")

RDB_SCHEMES = ("postgresql", "postgres", "mysql")
STORAGE_FORMS = (
    "sqlite:///PATH.db, journal:PATH, postgresql://USER@HOST/DB, mysql://USER@HOST/DB, "
    "or a file path ending in .db or .journal"
)
# A study name becomes a file name (studies/NAME.db, recipes/NAME.json): letters, digits and
# . _ - only, not starting with a dot or a dash.
STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class StorageURL:
    """A storage, parsed: what kind, the URL Optuna opens, and its file (if it has one)."""

    kind: str  # "sqlite", "journal" or "rdb"
    url: str
    path: Path | None = None  # the database or journal file; None in memory and on a server

    @property
    def in_memory(self) -> bool:
        return self.kind == "sqlite" and self.path is None


def parse_storage_url(text: str) -> StorageURL:
    """The storage `text` names, or UsageError (one line, no password in it) for anything that
    is not one of STORAGE_FORMS."""
    if not isinstance(text, str) or not text or len(text) > 4096 or any(c in text for c in "\0\n\r"):
        raise UsageError(f"storage {_shown_raw(text)}: not a storage; expected {STORAGE_FORMS}")
    scheme, sep, rest = text.partition("://")
    if text.startswith("journal:"):
        path = text[len("journal:") :]
        if not path or path.endswith("/") or "://" in text:
            raise UsageError(f"storage {_shown_raw(text)}: expected journal:PATH, a file path after 'journal:'")
        return StorageURL("journal", text, Path(path))
    if sep and re.fullmatch(r"sqlite(\+\w+)?", scheme):
        return _sqlite(text, rest)
    if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(\+\w+)?", scheme):
        if scheme.split("+", 1)[0].lower() not in RDB_SCHEMES:
            raise UsageError(
                f"storage {_shown_raw(text)}: unknown kind of storage {scheme!r}; expected {STORAGE_FORMS}"
            )
        return _rdb(text)
    # A plain path. Something that starts like a URL (a scheme, then ':') is a mistyped URL,
    # not a file name: taken as a path it would create folders named after a password.
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", text) or sep:
        raise UsageError(
            f"storage {_shown_raw(text)}: not a valid URL (a slash missing?); expected {STORAGE_FORMS}. "
            "A file whose name holds ':' can be given as ./NAME"
        )
    if text.endswith(".journal"):
        return StorageURL("journal", f"journal:{text}", Path(text))
    if text.endswith(".db"):
        return StorageURL("sqlite", f"sqlite:///{text}", Path(text))
    raise UsageError(f"storage {_shown_raw(text)}: not a storage; expected {STORAGE_FORMS}")


def _sqlite(text: str, rest: str) -> StorageURL:
    if rest in ("", "/:memory:"):
        return StorageURL("sqlite", text, None)
    if not rest.startswith("/") or rest == "/":
        raise UsageError(f"storage {_shown_raw(text)}: expected sqlite:///PATH (three slashes, then the file)")
    path = rest[1:].split("?", 1)[0]
    if not path or path.endswith("/"):
        raise UsageError(f"storage {_shown_raw(text)}: expected sqlite:///PATH (three slashes, then the file)")
    return StorageURL("sqlite", text, Path(path))


def _rdb(text: str) -> StorageURL:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise UsageError(
            f"storage {_shown_raw(text)}: cannot read it as a database URL; expected {STORAGE_FORMS}"
        ) from None
    # SQLAlchemy reads user:pass@host up to the first '@': a second one lands in the host or
    # the database name, and the rest of the password with it, shown wherever they are.
    if "@" in (url.host or "") or "@" in (url.database or "") or (url.host and "/" in url.host):
        raise UsageError(
            f"storage {_shown_raw(text)}: more than one '@' before the host; write an '@' inside the password as %40"
        )
    if not url.host and not url.query.get("host"):
        raise UsageError(f"storage {_shown_raw(text)}: no host; expected {STORAGE_FORMS}")
    if not url.database:
        raise UsageError(f"storage {_redact_rdb(text)}: no database name after the host (.../DBNAME)")
    return StorageURL("rdb", text, None)


def default_storage_url(study_name: str) -> str:
    return f"sqlite:///{STUDIES_DIR / (study_name + '.db')}"


def check_study_name(name: str) -> str:
    """A study name names files (studies/NAME.db, recipes/NAME.json): a plain name only."""
    if not isinstance(name, str) or not STUDY_NAME.fullmatch(name):
        raise UsageError(
            f"--study {_shown_raw(name)}: a study name is letters, digits and . _ - (at most 128, not "
            "starting with . or -), because it names files"
        )
    return name


def redact(url: str) -> str:
    """The storage URL (or REF, with #NAME) with its password replaced by ***: safe to print,
    log or store. A database URL goes through SQLAlchemy's parser, so what is hidden is what
    the driver would send (user:PW@host, and a `password=` query parameter). A file storage has
    no password and is shown as it is; text that is no storage at all is cut at its last '@'."""
    if not isinstance(url, str):
        return "***"
    base, name = split_ref(url)
    suffix = f"#{name}" if name is not None else ""
    try:
        parsed = parse_storage_url(base)
    except UsageError:
        return _shown_raw(url, quote_it=False)
    if parsed.kind != "rdb":
        return base + suffix
    if suffix and re.search(r"[?&](password|passwd|pwd)=", base, flags=re.I):
        # A raw '#' in a query password (…&password=PW#RD) reads as PW and a study named RD:
        # the part after '#' may be the password's end, so it is not shown either.
        suffix = "#***"
    try:
        return _redact_rdb(base) + suffix
    except Exception:  # noqa: BLE001 - never let a redaction fail open
        return f"{base.partition('://')[0]}://***"


def _redact_rdb(text: str) -> str:
    from sqlalchemy.engine import make_url

    url = make_url(text)
    if "@" in (url.host or "") or "@" in (url.database or ""):
        return f"{url.drivername}://***"
    base = url.set(query={}).render_as_string(hide_password=True)
    if not url.query:
        return base
    pairs = []
    for key, values in url.query.items():
        for value in values if isinstance(values, tuple) else (values,):
            shown = "***" if key.lower() in ("password", "passwd", "pwd") else quote_plus(value, safe="/:")
            pairs.append(f"{quote_plus(key)}={shown}")
    return f"{base}?{'&'.join(pairs)}"


def redact_text(text: str, url: str) -> str:
    """`text` (an error message) with the password of `url` hidden wherever it appears in it,
    in any of the spellings it may take, and any URL in it redacted."""
    for secret in _passwords(url):
        if len(secret) >= 1:
            text = text.replace(secret, "***")
    return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)


def _passwords(url: str) -> list[str]:
    found: set[str] = set()
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.password:
            found.add(str(parsed.password))
        for key, values in parsed.query.items():
            if key.lower() in ("password", "passwd", "pwd"):
                found.update(values if isinstance(values, tuple) else (values,))
    except Exception:  # noqa: BLE001 - not a database URL: no password to hide
        pass
    for secret in list(found):
        found.update({quote(secret, safe=""), quote_plus(secret), unquote(secret)})
    return sorted((s for s in found if s), key=len, reverse=True)


def _shown_raw(text: Any, *, quote_it: bool = True) -> str:
    """Text that failed to parse as a storage, fit to show: cut at the last '@' before a host
    (user:secret@ hidden), the password= parameter hidden, and short."""
    text = str(text)
    head, at, tail = text.rpartition("@")
    if at:
        scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/*", head)
        text = (scheme.group(0) if scheme else "") + "***@" + tail
    text = re.sub(r"([?&](?:password|passwd|pwd)=)[^&]*", r"\1***", text, flags=re.IGNORECASE)
    if len(text) > 200:
        text = text[:197] + "..."
    return repr(text) if quote_it else text


def heartbeat_interval_s() -> int:
    """Seconds between a worker's heartbeats: AUTOTUNE_HEARTBEAT_S, default 30. Shorter
    means a killed worker's trial is retried sooner, at the cost of more database writes."""
    raw = os.environ.get(HEARTBEAT_ENV)
    if raw is None or raw.strip() == "":
        return HEARTBEAT_INTERVAL_S
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{HEARTBEAT_ENV}: expected a whole number of seconds >= 1, got {raw!r}")
    return value


def default_grace_period_s() -> int:
    return GRACE_INTERVALS * heartbeat_interval_s()


class RetryStaleTrial(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry (same parameters, WAITING, `failed_trial` in its system attrs) minus the
    dead attempt's user attrs, which describe that attempt and not the configuration."""

    def __init__(self, max_retry: int | None = 1) -> None:
        with _quiet_experimental():
            super().__init__(max_retry=max_retry)

    def __call__(self, study: optuna.Study, trial: Any) -> None:
        clean = copy.copy(trial)
        clean.user_attrs = {k: v for k, v in trial.user_attrs.items() if k in RETRY_KEEPS}
        with _quiet_experimental():
            super().__call__(study, clean)


@contextlib.contextmanager
def _quiet_experimental() -> Iterator[None]:
    """Heartbeats and retries are "experimental" in Optuna (there since 2.x): not worth a
    warning on every user's terminal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def is_sqlite(url: str) -> bool:
    return parse_storage_url(url).kind == "sqlite"


def normalize_url(ref: str) -> str:
    """The URL Optuna opens for a storage given as a URL or a bare file path."""
    return parse_storage_url(ref).url


def with_driver(url: str) -> str:
    """A plain postgresql:// URL with the driver that is installed. SQLAlchemy 2.1 reads a
    bare postgresql:// as psycopg (3), while autotune's `postgres` extra installs psycopg2."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        return url
    for module, driver in (("psycopg2", "psycopg2"), ("psycopg", "psycopg")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    return f"postgresql://{rest}"  # SQLAlchemy will say which module is missing


def heartbeat_grace_s(url: str) -> int | None:
    """The heartbeat grace period for a storage, or None where heartbeats cannot work: an
    in-memory SQLite database is one per connection, so the heartbeat thread would find no
    tables (and nobody else can share the study anyway)."""
    return None if parse_storage_url(url).in_memory else default_grace_period_s()


def check_storage_writable(url: str) -> None:
    """Before a study runs: a file storage's folder must exist (the default studies/ is made
    for you) and take writes, and its disk must not be full; nothing is created here."""
    parsed = parse_storage_url(url)
    if parsed.path is None:
        return
    default_folder = parsed.path.parent == STUDIES_DIR
    check_writable(parsed.path, what="storage", create_folders=default_folder, shown_as=parsed.url)


def open_storage(url: str, *, grace_period_s: int | None = None, create: bool = True) -> optuna.storages.BaseStorage:
    """An Optuna storage for `url`. RDB storages get heartbeats (every heartbeat_interval_s()),
    so a trial whose worker was killed is failed after `grace_period_s` and retried once by
    another worker. `create=False`: the file must exist (reading a study). A storage file's
    folder is created only when it is the default studies/."""
    parsed = parse_storage_url(url)
    url = parsed.url
    try:
        if parsed.path is not None:
            path = parsed.path
            if not path.exists():
                if not create:
                    what = "journal file" if parsed.kind == "journal" else "database file"
                    raise UsageError(f"storage {url}: no such {what}")
                if not path.parent.is_dir():
                    if path.parent != STUDIES_DIR:
                        raise UsageError(f"storage {url}: the folder {path.parent} does not exist; create it first")
                    path.parent.mkdir(parents=True, exist_ok=True)
            elif path.is_dir():
                raise UsageError(f"storage {url}: is a folder, not a file")
        if parsed.kind == "journal":
            message = recover_journal(parsed.path, writable=create)
            if message:
                log.warning("%s", message)
            lock = JournalFileOpenLock(str(parsed.path))
            return JournalStorage(JournalFileBackend(str(parsed.path), lock_obj=lock))
        heartbeat = {}
        if grace_period_s is not None and not parsed.in_memory:
            interval = heartbeat_interval_s()
            heartbeat = dict(
                heartbeat_interval=interval,
                grace_period=max(grace_period_s, 2 * interval),
                heartbeat_stale_trial_callback=RetryStaleTrial(max_retry=1),
            )
        engine = {"connect_args": {"connect_timeout": 10}} if url.startswith("postgres") else None
        storage = _rdb_storage(with_driver(url), engine, heartbeat)
        check_schema(storage, url)
        return storage
    except UsageError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"storage {redact(url)}: cannot open it ({redact_text(first, url)})") from None


# --- journal files: a torn tail ----------------------------------------------------------------


def recover_journal(path: Path, *, writable: bool = True) -> str | None:
    """Make a journal file readable and safe to append to; returns what was done (for the user),
    or None when the file is whole. Holds the journal's own lock, so no writer appends meanwhile.

    A record cut short at the end (no newline: its writer died mid-write) is moved to
    `PATH.torn-<UTC time>` and the file cut back to its last whole record. A bad line inside
    the file (an older autotune appended after a torn record, gluing the two) is split: the
    whole record that ends the line is kept, the torn bytes before it go to the backup. A line
    that is neither is not guessed at: UsageError, the file untouched. `writable=False`
    (reading a study): nothing is changed; a torn tail, which Optuna skips, is only reported."""
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        return None
    lines = data.split(b"\n")
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


SCHEMA_ATTEMPTS = 5


def _rdb_storage(url: str, engine: dict[str, Any] | None, heartbeat: dict[str, Any]) -> RDBStorage:
    """RDBStorage creates Optuna's tables on first use. Workers starting together on a fresh
    database race to create them, and all but one fail on a duplicate table or type: those
    try again, and find the tables there."""
    import sqlalchemy.exc

    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            with _quiet_experimental():
                return RDBStorage(url, engine_kwargs=engine, skip_compatibility_check=True, **heartbeat)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.2 + random.random() * (attempt + 1))
    raise AssertionError("unreachable")


_newest_schema: list[str] = []  # read once per process, see check_schema


def check_schema(storage: RDBStorage, url: str) -> None:
    """The storage's tables must have the schema this Optuna writes. Optuna's own check (which
    `_rdb_storage` turns off) reads its alembic migration scripts on every open, tens of ms
    each time, as each script defines its tables again; the newest schema they name depends
    only on the installed Optuna, so a process reads them once for any number of storages."""
    if not _newest_schema:
        _newest_schema.append(storage.get_head_version())
    current, newest = storage.get_current_version(), _newest_schema[0]
    if current == newest:
        return
    shown = redact(url)
    if current in storage.get_all_versions():
        raise UsageError(
            f"storage {shown}: its tables have Optuna's schema {current}, this Optuna ({optuna.__version__}) "
            f"needs {newest}: run `optuna storage upgrade --storage {shown}` (back it up first)"
        )
    raise UsageError(
        f"storage {shown}: its tables have Optuna's schema {current}, made by a newer Optuna than this one "
        f"({optuna.__version__}): upgrade it (`pip install -U optuna`)"
    )


def study_names(storage: optuna.storages.BaseStorage) -> list[str]:
    return [s.study_name for s in storage.get_all_studies()]


def split_ref(ref: str) -> tuple[str, str | None]:
    """'PATH.db#study' -> ('PATH.db', 'study'); a REF without '#NAME' -> (ref, None)."""
    base, sep, name = ref.rpartition("#")
    if sep and base and name:
        return base, name
    return ref, None


def load_ref(ref: str) -> optuna.Study:
    """The study a REF names. A storage with several studies needs `#NAME` (UsageError,
    listing them, otherwise)."""
    url, name = split_ref(ref)
    storage = open_storage(url, create=False)
    names = study_names(storage)
    shown = redact(url)
    if not names:
        raise UsageError(f"{shown} holds no study")
    if name is None:
        if len(names) > 1:
            raise UsageError(f"{shown} holds {len(names)} studies; name one as {shown}#NAME: {', '.join(names)}")
        name = names[0]
    elif name not in names:
        raise UsageError(f"no study {name!r} in {shown}; it holds: {', '.join(names)}")
    return optuna.load_study(study_name=name, storage=storage)


def load_study(name: str | None, storage_url: str | None) -> optuna.Study:
    """An existing study for show/export/report, by name and/or storage."""
    if storage_url is None and name is None:
        raise UsageError("give --study NAME (and --storage URL when it is not the default SQLite file)")
    if storage_url is None:
        check_study_name(name)  # it names the file
    url = storage_url or default_storage_url(name)
    storage = open_storage(url, create=False)
    names = study_names(storage)
    if name is None:
        if len(names) != 1:
            raise UsageError(
                f"storage {redact(url)} holds {len(names)} studies ({', '.join(names) or 'none'}): give --study"
            )
        name = names[0]
    if name not in names:
        raise UsageError(f"no study {name!r} in {redact(url)}; it holds: {', '.join(names) or 'nothing'}")
    return optuna.load_study(study_name=name, storage=storage)


def internals(study: optuna.Study) -> tuple[optuna.storages.BaseStorage, int]:
    """The study's storage and id: the one place autotune reads Optuna's private attributes.
    Optuna has no public API to write a trial that another process left RUNNING (failing
    a dead tuner's trial), nor to hand a live study's storage to optuna-dashboard or name its
    dashboard page, so those three uses come here."""
    return study._storage, study._study_id
