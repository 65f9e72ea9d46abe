"""The study's disk fills while a search runs, or its file reaches the file size limit
(`ulimit -f`): the trial just measured is neither lost nor recorded as a failure. The search
stops in one line naming the storage and why, exit 1, with the best so far (that trial too)
written as the recipe; the trial is left running, so the next search measures it again."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from optuna.trial import TrialState
from sqlalchemy import event

import autotune.search.run
from autotune.errors import AutotuneError
from autotune.recipe.recipe import Recipe
from autotune.search.run import run_search
from autotune.units import format_bytes
from tests.attack_helpers import fake_trials
from tests.faked_tuner import SITE, larger_than_a_page
from tests.helpers import load, run_autotune, search_args, search_settings, with_site

FULL_AT = 3  # the fourth trial: after the references and a proposal of the planner's


def faster_each_time(m, index: int) -> None:
    """Each trial faster than the one before: the trial whose record fails is the best."""
    m.tokens_per_sec = 1000.0 * (index + 1)


def opened_storages(monkeypatch) -> list:
    opened: list = []
    real = autotune.search.run.open_storage

    def open_storage(*args, **kwargs):
        opened.append(real(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(autotune.search.run, "open_storage", open_storage)
    return opened


@pytest.mark.slow
def test_a_full_disk_mid_study_keeps_the_measured_trial_in_the_recipe_and_resumes_it(workdir, monkeypatch):
    """From the fourth trial on, the SQLite file cannot grow (max_page_count: SQLite then answers
    SQLITE_FULL, "database or disk is full", exactly as on a full disk)."""
    opened = opened_storages(monkeypatch)

    def fill_the_disk(engine) -> None:
        @event.listens_for(engine, "checkout")
        def no_more_pages(connection, *_):
            connection.execute("PRAGMA max_page_count = 1")  # never below the file's size: it stops growing

    def each(m, index: int) -> None:
        faster_each_time(m, index)
        if index == FULL_AT:
            fill_the_disk(opened[0].engine)
            larger_than_a_page(m)

    fake_trials(monkeypatch, each=each)
    db = Path("s.db")
    settings = search_settings(n_trials=6, storage=f"sqlite:///{db}", study="s", confirm=False)
    with pytest.raises(AutotuneError) as info:
        run_search(settings)
    assert info.value.exit_code == 1
    assert str(info.value) == (
        f"storage sqlite:///{db}: the disk holding {db} is full (database or disk is full); the search stopped; "
        f"trial {FULL_AT} (4,000 tok/s) could not be stored: the study measures it again when it resumes; "
        f"the best so far (trial {FULL_AT}) is in recipes/s.json"
    )
    recipe = Recipe.load("recipes/s.json")
    assert (recipe.study["trial"], recipe.measured["tokens_per_sec"]) == (FULL_AT, 4000.0)
    trials = load(f"sqlite:///{db}", "s").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * FULL_AT + [TrialState.RUNNING]

    # Room again: the same command resumes, fails the trial left running and measures it again.
    fake_trials(monkeypatch)
    run_search(search_settings(n_trials=1, storage=f"sqlite:///{db}", study="s", confirm=False))
    trials = load(f"sqlite:///{db}", "s").trials
    assert trials[FULL_AT].state == TrialState.FAIL and trials[FULL_AT].user_attrs["outcome"] == "interrupted"
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == FULL_AT]
    assert retry.state == TrialState.COMPLETE and retry.params == trials[FULL_AT].params


@pytest.mark.process  # a real RLIMIT_FSIZE: the kernel refuses the tuner's writes past it (EFBIG)
def test_the_file_size_limit_mid_study_is_one_line_and_keeps_the_measured_trial(tmp_path):
    """`ulimit -f` reached by the study's file: the kernel sends SIGXFSZ, which Python ignores
    (CPython does at start), so the write fails with EFBIG, which SQLite reports as a disk I/O
    error: told as the file size limit, with the limit."""
    env = with_site(tmp_path, SITE, FAKE_FSIZE_AT=str(FULL_AT), FAKE_FSIZE_DB=str(tmp_path / "studies" / "s.db"))
    args = search_args("sqlite:///studies/s.db", "s", 6, "--no-confirm")
    (tmp_path / "studies").mkdir()
    done = run_autotune(*args, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    with sqlite3.connect(tmp_path / "studies" / "s.db") as db:
        (pages,) = db.execute("PRAGMA page_count").fetchone()
    limit = format_bytes(os.path.getsize(tmp_path / "studies" / "s.db"))
    assert pages and done.stderr.splitlines()[-1] == (
        f"Error: storage sqlite:///studies/s.db: studies/s.db reached the file size limit ({limit}, ulimit -f) "
        f"(disk I/O error); raise the limit; the search stopped; trial {FULL_AT} (4,000 tok/s) could not be "
        f"stored: the study measures it again when it resumes; the best so far (trial {FULL_AT}) is in "
        "recipes/s.json"
    )
    assert Recipe.load(tmp_path / "recipes" / "s.json").study["trial"] == FULL_AT
