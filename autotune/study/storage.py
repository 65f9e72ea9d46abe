"""Optuna storages opened from a URL (`study.urls` parses and redacts them), with heartbeats
on database servers, journals repaired on open (`study.journal`), and the studies they hold.

A storage file's folder must exist, except the default `studies/`, which autotune creates.

Heartbeats (RDB storages): each worker's tuner records a heartbeat for its running trial
every AUTOTUNE_HEARTBEAT_S seconds (default 30) from a thread, whatever the trial is doing.
A trial whose heartbeat a worker has seen stand still for GRACE_INTERVALS heartbeats (default
120 s), by that worker's own monotonic clock, belongs to a worker that is gone (killed, host
lost): that worker fails it before its next trial and queues one retry. Timestamps are never
compared (`study.guarded`: a worker's clock or time zone may differ), so a live trial is never
failed for another host's clock; a killed worker's trial is retried after the grace period
plus, at most, the length of two trials of a surviving worker. A worker only paused past the
grace period finds its trial taken over when it resumes, and goes on (`search.optimize`). On
one host `journal:` has no heartbeats; there `search.run.fail_orphaned_trials` fails a
dead tuner's trial at resume.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import time
import warnings
from typing import Any, Iterator

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

from autotune import environment
from autotune.device.disk import check_writable
from autotune.errors import UsageError
from autotune.study.guarded import GuardedJournalStorage, GuardedRDBStorage, sqlite_connect_args
from autotune.study.journal import recover_journal
from autotune.study.storage_errors import storage_error
from autotune.study.urls import (
    STUDIES_DIR,
    check_study_name,
    default_storage_url,
    parse_storage_url,
    redact,
    redact_text,
    split_ref,
    with_driver,
)

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 30
HEARTBEAT_ENV = environment.HEARTBEAT_S
# A heartbeat comes from a thread of the tuner, not from the trial, so the grace period does
# not depend on the trial's length: a few missed beats (a busy database, a slow host) are
# tolerated, a dead worker is not.
GRACE_INTERVALS = 4
# User attrs a retried trial keeps: where its configuration came from. The rest (host, pids,
# outcome of the dead attempt) describe the attempt, and a stale tuner_pid on a running retry
# would make it look orphaned.
RETRY_KEEPS = ("reference", "warm_start_from", "warm_start_trial")


def heartbeat_interval_s() -> int:
    """Seconds between a worker's heartbeats: AUTOTUNE_HEARTBEAT_S, default 30. Shorter
    means a killed worker's trial is retried sooner, at the cost of more database writes."""
    return environment.value(HEARTBEAT_ENV)


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
            return GuardedJournalStorage(JournalFileBackend(str(parsed.path), lock_obj=lock), shown_url=url)
        heartbeat = {}
        if grace_period_s is not None and not parsed.in_memory:
            interval = heartbeat_interval_s()
            heartbeat = dict(
                heartbeat_interval=interval,
                grace_period=max(grace_period_s, 2 * interval),
                heartbeat_stale_trial_callback=RetryStaleTrial(max_retry=1),
            )
        engine, lock_wait = None, None
        if url.startswith("postgres"):
            engine = {"connect_args": {"connect_timeout": 10}}
        elif parsed.kind == "sqlite":
            engine, lock_wait = {"connect_args": sqlite_connect_args()}, environment.value(environment.LOCK_WAIT_S)
        storage = _rdb_storage(url, engine, heartbeat, lock_wait)
        check_schema(storage, url)
        return storage
    except UsageError:
        raise
    except Exception as exc:
        known = storage_error(exc, url)  # a damaged file, a lock: said as every command says them
        if known is not None:
            raise known from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"storage {redact(url)}: cannot open it ({redact_text(first, url)})") from None


SCHEMA_ATTEMPTS = 5


def _rdb_storage(
    url: str, engine: dict[str, Any] | None, heartbeat: dict[str, Any], lock_wait_s: int | None = None
) -> RDBStorage:
    """RDBStorage creates Optuna's tables on first use. Workers starting together on a fresh
    database race to create them, and all but one fail on a duplicate table or type: those
    try again, and find the tables there."""
    import sqlalchemy.exc

    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            with _quiet_experimental():
                return GuardedRDBStorage(
                    with_driver(url),
                    shown_url=url,
                    lock_wait_s=lock_wait_s,
                    engine_kwargs=engine,
                    skip_compatibility_check=True,
                    **heartbeat,
                )
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
