"""A storage that fails under a command: a SQLite file damaged behind a valid header, and a
lock another process holds on it. Each is one line naming the file, never a traceback."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotune.errors import AutotuneError
from autotune.recipe.recipe import Recipe
from autotune.search.run import run_search
from tests.attack_helpers import fake_trials
from tests.helpers import FAST, TINY_SPACE, invoke, search_settings


def damage(path: Path, tables: tuple[str, ...] = ("trials", "trial_user_attributes")) -> None:
    """Overwrite the first page of `tables`: the header and the schema stay valid, so the file
    opens as a SQLite database and reading its trials finds garbage."""
    with sqlite3.connect(path) as db:
        roots = dict(db.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'table'"))
        (page_size,) = db.execute("PRAGMA page_size").fetchone()
    db.close()
    with open(path, "r+b") as f:
        for table in tables:
            f.seek((roots[table] - 1) * page_size)
            f.write(b"\xab" * page_size)


@pytest.mark.slow
def test_a_database_damaged_behind_its_header_is_one_line_for_every_reader(workdir, monkeypatch):
    """A real study of a few trials (a search, its trials faked), then the pages of its trials
    overwritten. Every command that reads it, `search` resuming it too, says in one line which
    file is not a readable database and what to do, exit 2."""
    fake_trials(monkeypatch)
    db = Path("s.db")
    run_search(search_settings(n_trials=3, storage=f"sqlite:///{db}", study="s", confirm=False))
    damage(db)
    line = (
        f"Error: storage sqlite:///{db}: {db} is not a readable SQLite database (database disk image is "
        "malformed): restore it from a backup\n"
    )
    search = ["search", "--model", "gpt2-tiny", *FAST, "--space", str(TINY_SPACE), "--storage", f"sqlite:///{db}"]
    for command in (
        ["show", "--storage", str(db)],
        ["show", "--storage", str(db), "--study", "s"],
        ["export", "--study", "s", "--storage", str(db)],
        ["compare", str(db)],
        ["report", "--study", "s", "--storage", str(db), "--out", "report"],
        [*search, "--study", "s", "--n-trials", "1"],
    ):
        result = invoke(*command)
        assert (result.exit_code, result.stderr) == (2, line), command
    assert not Path("report").exists()


# --- a lock another process holds ------------------------------------------------------------------

HOLD_LOCK = (
    "import sqlite3, sys; db = sqlite3.connect(sys.argv[1], isolation_level=None); db.execute('BEGIN EXCLUSIVE'); "
    "print('locked', flush=True); sys.stdin.readline(); db.execute('COMMIT')"
)
LOCK_AT = 3  # the fourth trial: its result is to be written while the lock is held


class LockHolder:
    """A second connection, in another process, holding the database's exclusive lock (BEGIN
    EXCLUSIVE: nobody else reads or writes) until `release`."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline() == "locked\n"
        self._released = threading.Lock()

    def release(self) -> None:
        with self._released:
            if self.proc.poll() is None:
                self.proc.communicate("\n", timeout=60)


class OnLogLine(logging.Handler):
    """Calls `then` when a log line containing `text` is emitted (once), and counts such lines."""

    def __init__(self, text: str, then) -> None:
        super().__init__(logging.WARNING)
        self.text, self.then, self.lines = text, then, []

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.lines.append(record.getMessage())
            if len(self.lines) == 1:
                self.then()


@contextlib.contextmanager
def lock_at_trial(monkeypatch, db: Path, *, release_on: str | None):
    """Trials faked, each faster than the one before; when the fourth is measured, another
    process takes the database's lock, released when the tuner logs `release_on` (or at the end).
    A heartbeat a second: the heartbeat thread meets the lock too."""
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")
    holders: list[LockHolder] = []

    def each(m, index: int) -> None:
        m.tokens_per_sec = 1000.0 * (index + 1)
        if index == LOCK_AT:
            holders.append(LockHolder(db))

    fake_trials(monkeypatch, each=each)
    notice = OnLogLine(release_on or "\0", lambda: holders[0].release())
    logging.getLogger("autotune").addHandler(notice)
    try:
        yield notice
    finally:
        logging.getLogger("autotune").removeHandler(notice)
        for holder in holders:
            holder.release()


# A heartbeat thread that died of the lock would be an unhandled thread exception: an error here.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


@pytest.mark.process  # the lock is another process's
def test_a_search_waits_for_a_lock_another_process_holds_and_goes_on(workdir, monkeypatch):
    """The lock is taken as the fourth trial's result is to be written: the tuner waits, says so
    once, naming the file and how long it waits; the lock released, every trial is stored."""
    db = Path("s.db")
    with lock_at_trial(monkeypatch, db, release_on="locked by another process") as notice:
        result = run_search(search_settings(n_trials=6, storage=f"sqlite:///{db}", study="s", confirm=False))
    assert notice.lines == [
        f"storage sqlite:///{db}: the database is locked by another process; waiting for it up to 120 s "
        "(AUTOTUNE_LOCK_WAIT_S)"
    ]
    assert [t.state for t in result.study.trials] == [TrialState.COMPLETE] * 6
    assert result.summary.best.number == 5


@pytest.mark.process
def test_a_lock_held_past_the_wait_stops_the_search_in_one_line_with_the_best_so_far(workdir, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_LOCK_WAIT_S", "1")
    db = Path("s.db")
    with lock_at_trial(monkeypatch, db, release_on=None) as notice:
        with pytest.raises(AutotuneError) as info:
            run_search(search_settings(n_trials=6, storage=f"sqlite:///{db}", study="s", confirm=False))
        assert len(notice.lines) == 0  # nothing released it
        shown = invoke("show", "--storage", str(db))  # a reader waits as long, then says the same
    assert info.value.exit_code == 1
    locked = (
        f"storage sqlite:///{db}: the database is locked by another process (database is locked; waited 1 s, "
        "AUTOTUNE_LOCK_WAIT_S); close what holds it (a sqlite3 shell, a backup, another tuner)"
    )
    assert str(info.value) == (
        f"{locked}; the search stopped; trial {LOCK_AT} (4,000 tok/s) could not be stored: the study measures it "
        f"again when it resumes; the best so far (trial {LOCK_AT}) is in recipes/s.json"
    )
    assert Recipe.load("recipes/s.json").study["trial"] == LOCK_AT
    assert shown.exit_code == 1 and shown.stderr.splitlines()[-1] == f"Error: {locked}"
