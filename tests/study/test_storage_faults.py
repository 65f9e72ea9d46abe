"""A storage that fails under a command: a SQLite file damaged behind a valid header, and a
lock another process holds on it. Each is one line naming the file, never a traceback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

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
