"""Optuna's storages as autotune opens them: every call whose storage fails says so in one line
naming it (`study.storage_errors`), never with a traceback of Optuna's and SQLAlchemy's
internals, whichever command was reading or writing.

Each storage method Optuna calls is wrapped (`_guard_methods`): what escapes it is turned into a
StorageError when a storage failure is behind it, and passed on untouched otherwise (Optuna's
own errors: a finished trial, a duplicate study, a missing record).

A SQLite file another process has locked (a `sqlite3` shell inside a transaction, a backup,
another tuner) is waited for: SQLite's busy timeout waits LOCK_ATTEMPT_S in each attempt, and
a refused call is tried again, the whole call (Optuna rolled its transaction back), until
AUTOTUNE_LOCK_WAIT_S (default 120 s) have passed since the lock was first met. That is said
once, as the wait starts, naming the file; calls refused while the lock lasts share one wait,
so a command that gives up does not wait again to read what it knew.

A trial attribute whose stored JSON does not decode (a hand-edited or torn database) is left out
of the trial Optuna builds, and named in its DAMAGED_ATTRS system attr: its record says so and
its readers skip it (`study.record`), where Optuna raised JSONDecodeError from every command that
read the study. Any other stored value that does not decode (a study's attr) is one line."""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from typing import Any, Callable

from optuna.storages import BaseStorage, RDBStorage
from optuna.storages.journal import JournalStorage
from optuna.trial import FrozenTrial, TrialState

from autotune import environment
from autotune.study.record import DAMAGED_ATTRS
from autotune.study.storage_errors import LOCKED, StorageError, causes, file_storage_error, storage_error
from autotune.study.urls import redact, redact_text

log = logging.getLogger(__name__)

LOCK_ATTEMPT_S = 1.0  # SQLite's busy timeout in one attempt
LOCK_PAUSE_S = 0.1  # between attempts


def sqlite_connect_args() -> dict[str, Any]:
    """SQLite's busy timeout for one attempt (the driver's default is 5 s); the guard tries again."""
    return {"timeout": LOCK_ATTEMPT_S}


# What Optuna's cached storage (which wraps every RDBStorage a study uses) calls on it beyond the
# public methods of a storage (`optuna/storages/_cached_storage.py`).
RDB_PRIVATE_CALLS = ("_create_new_trial", "_get_best_trial_id", "_get_trials", "_set_trial_param")
RDB_VERSION_CALLS = ("get_current_version", "get_head_version", "get_all_versions")


class _Guarded:
    """Runs a storage method; a failure of the storage behind what it raises becomes one
    StorageError naming the storage (`shown_url`: the URL as the user gave it). A lock another
    process holds is waited for, up to `lock_wait_s` (None: not waited for)."""

    shown_url: str
    lock_wait_s: int | None = None
    _locked_since: float | None = None  # when a call first met the lock that holds now
    _lock_state: threading.Lock  # guards _locked_since: the heartbeat thread calls too

    def _guarded_call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        while True:
            try:
                result = self._attempt(method, *args, **kwargs)
            except StorageError as error:
                if error.kind != LOCKED or not self._still_waiting():
                    raise
                continue
            self._lock_released()
            return result

    def _attempt(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if any(isinstance(c, StorageError) for c in causes(exc)):
                raise  # said already, by a guarded call this one made
            error = self._storage_error(exc)
            if error is None:
                raise
            raise error from exc

    def _storage_error(self, exc: Exception) -> StorageError | None:
        return storage_error(exc, self.shown_url, waited_s=self.lock_wait_s)

    def _still_waiting(self) -> bool:
        """Whether a call refused by a lock tries again: within the wait since the lock was met.
        The first refused call says once that it waits."""
        if self.lock_wait_s is None:
            return False
        now = time.monotonic()
        with self._lock_state:
            if self._locked_since is None:
                self._locked_since = now
                log.warning(
                    "storage %s: the database is locked by another process; waiting for it up to %d s (%s)",
                    redact(self.shown_url),
                    self.lock_wait_s,
                    environment.LOCK_WAIT_S,
                )
            waiting = now - self._locked_since < self.lock_wait_s
        if waiting:
            time.sleep(LOCK_PAUSE_S)  # SQLite answers at once when waiting could deadlock
        return waiting

    def _lock_released(self) -> None:
        if self._locked_since is None:
            return
        with self._lock_state:
            since, self._locked_since = self._locked_since, None
        if since is not None:
            log.info("storage %s: the lock was released after %.0f s", redact(self.shown_url), time.monotonic() - since)


class GuardedRDBStorage(_Guarded, RDBStorage):
    """An RDBStorage (SQLite, PostgreSQL, MySQL) whose failures are one line. `lock_wait_s`:
    seconds a call waits for another process's lock (SQLite; the engine's connections must
    have a busy timeout of LOCK_ATTEMPT_S, `sqlite_connect_args`)."""

    def __init__(self, url: str, *, shown_url: str, lock_wait_s: int | None = None, **kwargs: Any) -> None:
        self.shown_url, self.lock_wait_s = shown_url, lock_wait_s
        self._lock_state = threading.Lock()
        self._guarded_call(RDBStorage.__init__, url, **kwargs)  # it reads the file: a lock is waited for here too
        self._heartbeat_failed = False
        self._watched: dict[int, tuple[Any, float]] = {}  # trial id -> (its heartbeat, when first seen so)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        """The running trials whose heartbeat this process has seen stand still for longer than
        the grace period, by its own monotonic clock. Optuna compares the heartbeat's timestamp
        with the database's now() instead, each read in its worker's session: a worker whose
        session clock runs ahead (another time zone, PGTZ) saw a live trial hours old and failed
        it. Whether a heartbeat still changes needs no clock. A trial is judged only after it
        has been watched for the grace period: Optuna calls this before each trial, so a dead
        worker's trial is failed within the grace period and two trials of the watching worker."""
        beats = self._guarded_call(GuardedRDBStorage._heartbeats, study_id)
        now = time.monotonic()
        watched = {}
        for trial_id, beat in beats.items():
            seen, since = self._watched.get(trial_id, (None, now))
            watched[trial_id] = (beat, since if seen == beat else now)
        self._watched = watched
        grace = self.grace_period or 2 * (self.heartbeat_interval or 0)
        return [trial_id for trial_id, (_, since) in watched.items() if now - since > grace]

    def _heartbeats(self, study_id: int) -> dict[int, Any]:
        """The last heartbeat of each running trial of the study that has one (Optuna's table:
        it has no public reader)."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        beat = models.TrialHeartbeatModel
        with _create_scoped_session(self.scoped_session) as session:
            rows = (
                session.query(beat.trial_id, beat.heartbeat)
                .join(models.TrialModel, models.TrialModel.trial_id == beat.trial_id)
                .filter(models.TrialModel.study_id == study_id, models.TrialModel.state == TrialState.RUNNING)
                .all()
            )
        return {trial_id: value for trial_id, value in rows}

    def record_heartbeat(self, trial_id: int) -> None:
        """One heartbeat, from Optuna's heartbeat thread. It never waits for a lock and never
        raises (a thread that raised would stop beating, with a traceback): a beat that cannot be
        written is missed, and the next one tries again. A failure other than a lock (which the
        tuner's own calls report) is said once."""
        try:
            self._attempt(RDBStorage.record_heartbeat, trial_id)
        except Exception as exc:  # noqa: BLE001 - whatever it was, the thread goes on beating
            if (isinstance(exc, StorageError) and exc.kind == LOCKED) or self._heartbeat_failed:
                return
            self._heartbeat_failed = True
            shown = redact(self.shown_url)
            said = str(exc) if isinstance(exc, StorageError) else f"storage {shown}: {self._first_line(exc)}"
            log.warning("%s; a heartbeat was missed (the next one tries again)", said)

    def _first_line(self, exc: BaseException) -> str:
        lines = str(exc).strip().splitlines()
        return redact_text(f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__, self.shown_url)

    def _build_frozen_trial_from_trial_model(self, trial: Any) -> FrozenTrial:
        """The trial as Optuna builds it; one with attributes whose JSON does not decode, built
        without them, and those named in its DAMAGED_ATTRS system attr."""
        try:
            return super()._build_frozen_trial_from_trial_model(trial)
        except (TypeError, ValueError):  # json.loads of a damaged value (built again below, without it)
            pass
        (user, bad_user), (system, bad_system) = _decodable(trial.user_attributes), _decodable(trial.system_attributes)
        frozen = super()._build_frozen_trial_from_trial_model(_WithAttributes(trial, user, system))
        frozen.system_attrs[DAMAGED_ATTRS] = bad_user + bad_system
        return frozen


def _decodable(attributes: Any) -> tuple[list[Any], list[str]]:
    """The attribute rows whose stored JSON decodes, and the keys of those whose does not."""
    kept, damaged = [], []
    for attribute in attributes:
        try:
            json.loads(attribute.value_json)
        except (TypeError, ValueError):
            damaged.append(attribute.key)
            continue
        kept.append(attribute)
    return kept, damaged


class _WithAttributes:
    """A trial row as Optuna reads it, with these attribute rows in place of its own (the row
    itself is left as it is: a change to it would be written back)."""

    def __init__(self, row: Any, user_attributes: list[Any], system_attributes: list[Any]) -> None:
        self._row, self.user_attributes, self.system_attributes = row, user_attributes, system_attributes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._row, name)


class GuardedJournalStorage(_Guarded, JournalStorage):
    """A journal file whose failures (a full disk, the file size limit) are one line."""

    def __init__(self, backend: Any, *, shown_url: str) -> None:
        self.shown_url = shown_url
        self._lock_state = threading.Lock()
        super().__init__(backend)

    def _storage_error(self, exc: Exception) -> StorageError | None:
        if isinstance(exc, OSError):  # the journal's own file: nothing else is written here
            return file_storage_error(exc, self.shown_url)
        return super()._storage_error(exc)


def _storage_methods() -> list[str]:
    return sorted(n for n, v in vars(BaseStorage).items() if callable(v) and not n.startswith("_"))


def _guard_methods(cls: type, base: type, names: list[str]) -> None:
    """Wrap `base`'s methods `names` in `cls` with `_guarded_call`, unless `cls` defines its own."""
    for name in names:
        if name in vars(cls):
            continue
        method = getattr(base, name)

        @functools.wraps(method)
        def call(self: _Guarded, *args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
            return self._guarded_call(_method, *args, **kwargs)

        setattr(cls, name, call)


_guard_methods(GuardedRDBStorage, RDBStorage, [*_storage_methods(), *RDB_PRIVATE_CALLS, *RDB_VERSION_CALLS])
_guard_methods(GuardedJournalStorage, JournalStorage, _storage_methods())
