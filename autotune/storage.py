"""Optuna storages from a URL, with passwords kept out of every message.

    sqlite:///studies/NAME.db            the default: one file per study, one worker
    postgresql://user:pw@host/db         many workers on many hosts (heartbeats on)
    journal:PATH                         Optuna's journal file: many workers on one host,
                                         no database server (JournalFileBackend)
    a bare PATH.db / PATH.journal        the same, for `compare` and `--warm-start-from`
"""

from __future__ import annotations

import re
from pathlib import Path

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

from autotune.errors import UsageError

HEARTBEAT_INTERVAL_S = 30
STUDIES_DIR = Path("studies")


def default_storage_url(study_name: str) -> str:
    return f"sqlite:///{STUDIES_DIR / (study_name + '.db')}"


def redact(url: str) -> str:
    """The URL with any password replaced by ***: safe to print, log or store."""
    return re.sub(r"(://[^:/@]+:)([^@]*)@", r"\1***@", url)


def normalize_url(ref: str) -> str:
    """Accept bare file paths as well as URLs."""
    if "://" in ref or ref.startswith("journal:"):
        return ref
    if ref.endswith(".journal"):
        return f"journal:{ref}"
    return f"sqlite:///{ref}"


def open_storage(url: str, *, grace_period_s: int | None = None, create: bool = True) -> optuna.storages.BaseStorage:
    """An Optuna storage for `url`. RDB storages get heartbeats, so a trial whose worker was
    killed is failed after `grace_period_s` and retried once by another worker."""
    url = normalize_url(url)
    try:
        if url.startswith("journal:"):
            path = Path(url[len("journal:"):])
            if not create and not path.exists():
                raise UsageError(f"storage {url}: no such journal file")
            path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
        if url.startswith("sqlite:///"):
            path = Path(url[len("sqlite:///"):])
            if not create and not path.exists():
                raise UsageError(f"storage {url}: no such database file")
            path.parent.mkdir(parents=True, exist_ok=True)
        heartbeat = {}
        if grace_period_s is not None:
            heartbeat = dict(heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=max(grace_period_s, 2 * HEARTBEAT_INTERVAL_S),
                             heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))
        engine = {"connect_args": {"connect_timeout": 10}} if url.startswith("postgresql") else None
        return RDBStorage(url, engine_kwargs=engine, **heartbeat)
    except UsageError:
        raise
    except Exception as exc:
        reason = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise UsageError(f"storage {redact(url)}: cannot open it ({reason})") from None


def study_names(storage: optuna.storages.BaseStorage) -> list[str]:
    return [s.study_name for s in storage.get_all_studies()]
