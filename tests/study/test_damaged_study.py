"""A readable but damaged study (issue D, E01/E02): a trial attribute whose stored JSON does not
decode, a measured trial without its configuration or its figure. Every command reading it skips
the damaged trial with one warning line naming it, or refuses in one line; never a traceback.
The damage is done as an attacker does it: an UPDATE or DELETE on the SQLite file."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3

import optuna
import pytest

from autotune.study.storage import load_study
from autotune.study.summary import summarize
from tests.attack_helpers import FAST, fake_trials
from tests.helpers import invoke, synthetic_study

STUDY = "gpt2-nvidia-h200"

# What is done to the best trial's rows (its trial_id bound to `?`), and what its warning says.
DAMAGES = {
    "config not JSON": (
        "UPDATE trial_user_attributes SET value_json = '{not json' WHERE key = 'config' AND trial_id = ?",
        "config is not JSON",
    ),
    "constraint not JSON": (  # a system attr: with it left out, the trial would read as within the limit
        "UPDATE trial_system_attributes SET value_json = '[1,' WHERE key = 'constraints:memory' AND trial_id = ?",
        "constraints:memory is not JSON",
    ),
    "no config": ("DELETE FROM trial_user_attributes WHERE key = 'config' AND trial_id = ?", "no configuration"),
    "no figure": (
        "DELETE FROM trial_user_attributes WHERE key IN ('measurement', 'tokens_per_sec') AND trial_id = ?",
        "no tokens/s",
    ),
}


@pytest.fixture(scope="module")
def clean_db(tmp_path_factory):
    """A synthetic study of 6 trials (SQLite), made once; and the number of its best trial."""
    db = tmp_path_factory.mktemp("clean") / "h200.db"
    study = synthetic_study(f"sqlite:///{db}", n=6)
    return db, summarize(study).best.number


def damaged_copy(clean_db, tmp_path, damage: str):
    db, best = clean_db
    copy = tmp_path / "h200.db"
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as con:
        (trial_id,) = con.execute("SELECT trial_id FROM trials WHERE number = ?", (best,)).fetchone()
        assert con.execute(DAMAGES[damage][0], (trial_id,)).rowcount > 0
    return copy, best


def commands(db, tmp_path):
    clean = tmp_path / "clean.db"
    return {
        "show": ["show", "--storage", str(db)],
        "show --json": ["show", "--storage", str(db), "--json"],
        "export": ["export", "--storage", str(db), "-o", str(tmp_path / "r.json")],
        "report": ["report", "--storage", str(db), "--out", str(tmp_path / "report")],
        "compare": ["compare", str(db), str(clean)],
    }


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("command", ["show", "show --json", "export", "report", "compare"])
@pytest.mark.slow
def test_a_damaged_trial_is_skipped_with_one_warning_by_every_command(
    clean_db, tmp_path, monkeypatch, caplog, command, damage
):
    db, best = damaged_copy(clean_db, tmp_path, damage)
    shutil.copy(clean_db[0], tmp_path / "clean.db")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING):
        result = invoke(*commands(db, tmp_path)[command])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    said = [r.getMessage() for r in caplog.records if f"trial #{best} " in r.getMessage()]
    assert len(said) == 1 and DAMAGES[damage][1] in said[0] and "\n" not in said[0], said
    assert f"study {STUDY}: trial #{best} skipped" in said[0]
    if command == "export":  # the recipe is another trial's, with its figure
        recipe = json.loads((tmp_path / "r.json").read_text())
        assert recipe["study"]["trial"] != best and recipe["measured"]["tokens_per_sec"] > 0
    if command == "show --json":
        assert json.loads(result.output)["best"]["number"] != best


def test_a_study_attribute_that_is_not_json_is_refused_in_one_line(clean_db, tmp_path, monkeypatch):
    """A study's own attrs (its hardware, its limit) have no trial to skip: refused, naming the storage."""
    db = tmp_path / "h200.db"
    shutil.copy(clean_db[0], db)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE study_user_attributes SET value_json = 'nan nan' WHERE key = 'hardware'")
    monkeypatch.chdir(tmp_path)
    for command in ("show", "export", "report"):
        result = invoke(*commands(db, tmp_path)[command])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert "a stored value is not JSON" in result.output and str(db) in result.output
    assert not (tmp_path / "report").exists() and not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_a_search_resumes_a_study_with_a_damaged_trial_and_skips_it(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    made = invoke("search", *FAST, "--n-trials", "2", "--no-confirm")
    assert made.exit_code == 0, made.output
    db = tmp_path / "studies" / "gpt2-tiny-cpu.db"
    with sqlite3.connect(db) as con:
        con.execute("UPDATE trial_user_attributes SET value_json = '{' WHERE key = 'config' AND trial_id = 1")
    with caplog.at_level(logging.WARNING):
        resumed = invoke("search", *FAST, "--n-trials", "1", "--no-confirm")
    assert resumed.exit_code == 0, resumed.output
    assert any("trial #0 skipped" in r.getMessage() for r in caplog.records)
    study = load_study("gpt2-tiny-cpu", f"sqlite:///{db}")
    assert len(study.trials) == 3 and study.trials[-1].state is optuna.trial.TrialState.COMPLETE
