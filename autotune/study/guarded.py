"""Optuna's storages as autotune opens them: every call whose storage fails says so in one line
naming it (`study.storage_errors`), never with a traceback of Optuna's and SQLAlchemy's
internals, whichever command was reading or writing.

Each storage method Optuna calls is wrapped (`_guard_methods`): what escapes it is turned into a
StorageError when a storage failure is behind it, and passed on untouched otherwise (Optuna's
own errors: a finished trial, a duplicate study, a missing record)."""

from __future__ import annotations

import functools
from typing import Any, Callable

from optuna.storages import BaseStorage, RDBStorage
from optuna.storages.journal import JournalStorage

from autotune.study.storage_errors import StorageError, causes, file_storage_error, storage_error

# What Optuna's cached storage (which wraps every RDBStorage a study uses) calls on it beyond the
# public methods of a storage (`optuna/storages/_cached_storage.py`).
RDB_PRIVATE_CALLS = ("_create_new_trial", "_get_best_trial_id", "_get_trials", "_set_trial_param")
RDB_VERSION_CALLS = ("get_current_version", "get_head_version", "get_all_versions")


class _Guarded:
    """Runs a storage method; a failure of the storage behind what it raises becomes one
    StorageError naming the storage (`shown_url`: the URL as the user gave it)."""

    shown_url: str

    def _guarded_call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
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
        return storage_error(exc, self.shown_url)


class GuardedRDBStorage(_Guarded, RDBStorage):
    """An RDBStorage (SQLite, PostgreSQL, MySQL) whose failures are one line."""

    def __init__(self, url: str, *, shown_url: str, **kwargs: Any) -> None:
        self.shown_url = shown_url
        super().__init__(url, **kwargs)


class GuardedJournalStorage(_Guarded, JournalStorage):
    """A journal file whose failures (a full disk, the file size limit) are one line."""

    def __init__(self, backend: Any, *, shown_url: str) -> None:
        self.shown_url = shown_url
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
