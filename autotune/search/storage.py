"""Optuna storages from a URL, with passwords kept out of every message.

    sqlite:///studies/NAME.db            the default: one file per study, one worker
    postgresql://user:pw@host/db         many workers on many hosts (heartbeats on)
    journal:PATH                         Optuna's journal file: many workers on one host,
                                         no database server (JournalFileBackend)
    a bare PATH.db / PATH.journal        the same, for `compare` and `--warm-start-from`

A REF names one study: a storage and, when it holds more than one, `#NAME`
(`studies/gpt2-nvidia-a100.db`, `postgresql://tuner@db/autotune#gpt2-h200`).

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
import importlib.util
import os
import random
import re
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

from autotune.errors import UsageError

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


def default_storage_url(study_name: str) -> str:
    return f"sqlite:///{STUDIES_DIR / (study_name + '.db')}"


def redact(url: str) -> str:
    """The URL with any password replaced by ***: safe to print, log or store.
    Both places a URL can carry one: user:PASSWORD@host and ?password=PASSWORD."""
    url = re.sub(r"(://[^:/@]+:)([^@]*)@", r"\1***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url, flags=re.IGNORECASE)


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
    return normalize_url(url).startswith("sqlite")


def normalize_url(ref: str) -> str:
    """Accept bare file paths as well as URLs."""
    if "://" in ref or ref.startswith("journal:"):
        return ref
    if ref.endswith(".journal"):
        return f"journal:{ref}"
    return f"sqlite:///{ref}"


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


def open_storage(url: str, *, grace_period_s: int | None = None, create: bool = True) -> optuna.storages.BaseStorage:
    """An Optuna storage for `url`. RDB storages get heartbeats (every heartbeat_interval_s()),
    so a trial whose worker was killed is failed after `grace_period_s` and retried once by
    another worker."""
    url = normalize_url(url)
    try:
        if url.startswith("journal:"):
            path = Path(url[len("journal:") :])
            if not create and not path.exists():
                raise UsageError(f"storage {url}: no such journal file")
            path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
        if url.startswith("sqlite:///"):
            path = Path(url[len("sqlite:///") :])
            if not create and not path.exists():
                raise UsageError(f"storage {url}: no such database file")
            path.parent.mkdir(parents=True, exist_ok=True)
        heartbeat = {}
        if grace_period_s is not None:
            interval = heartbeat_interval_s()
            heartbeat = dict(
                heartbeat_interval=interval,
                grace_period=max(grace_period_s, 2 * interval),
                heartbeat_stale_trial_callback=RetryStaleTrial(max_retry=1),
            )
        engine = {"connect_args": {"connect_timeout": 10}} if url.startswith("postgres") else None
        return _rdb_storage(with_driver(url), engine, heartbeat)
    except UsageError:
        raise
    except Exception as exc:
        reason = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise UsageError(f"storage {redact(url)}: cannot open it ({reason})") from None


SCHEMA_ATTEMPTS = 5


def _rdb_storage(url: str, engine: dict[str, Any] | None, heartbeat: dict[str, Any]) -> RDBStorage:
    """RDBStorage creates Optuna's tables on first use. Workers starting together on a fresh
    database race to create them, and all but one fail on a duplicate table or type: those
    try again, and find the tables there."""
    import sqlalchemy.exc

    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            with _quiet_experimental():
                return RDBStorage(url, engine_kwargs=engine, **heartbeat)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.2 + random.random() * (attempt + 1))
    raise AssertionError("unreachable")


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
