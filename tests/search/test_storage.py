"""autotune.study.storage: REFs naming a study, journal files and PostgreSQL (tables created
once by workers starting together), heartbeats that fail and retry a killed worker's trial,
and passwords, never shown."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import UsageError
from autotune.study.storage import RetryStaleTrial, default_grace_period_s, load_ref, open_storage
from autotune.study.urls import redact, split_ref
from tests.faked_tuner import SITE
from tests.helpers import (
    finish,
    invoke,
    load,
    repo_env,
    run_autotune,
    run_together,
    search_args,
    start_tuner,
    wait_for,
    with_site,
)


def test_split_ref():
    assert split_ref("studies/x.db") == ("studies/x.db", None)
    assert split_ref("studies/x.db#gpt2-h200") == ("studies/x.db", "gpt2-h200")
    assert split_ref("postgresql://tuner@db/autotune#gpt2-h200") == ("postgresql://tuner@db/autotune", "gpt2-h200")


@pytest.mark.process
def test_a_storage_with_several_studies_needs_a_name(studies):
    with pytest.raises(UsageError, match=r"holds 2 studies; name one as .*#NAME: a, b"):
        load_ref(str(studies / "both.db"))
    assert load_ref(f"{studies}/both.db#b").study_name == "b"
    with pytest.raises(UsageError, match="no study 'c'"):
        load_ref(f"{studies}/both.db#c")
    result = invoke("compare", str(studies / "both.db"), str(studies / "a.db"))
    assert result.exit_code == 2 and "a, b" in result.output
    result = invoke("compare", f"{studies}/both.db#a", f"{studies}/both.db#b", "--json")
    assert result.exit_code == 0, result.output
    assert [s["study"] for s in json.loads(result.output)["studies"]] == ["a", "b"]


def test_a_missing_file_is_a_usage_error(tmp_path):
    result = invoke("compare", str(tmp_path / "nope.db"))
    assert result.exit_code == 2 and "no such database file" in result.output
    assert not (tmp_path / "nope.db").exists()


@pytest.mark.slow
def test_reopening_a_storage_does_not_read_optunas_migration_scripts_again(tmp_path, monkeypatch):
    """Optuna's own schema check reads its alembic migration scripts on every open (tens of ms:
    each defines its tables again); the newest schema they name depends only on the installed
    Optuna, so a process reads them at most once to check any number of storages."""
    import alembic.script

    url = f"sqlite:///{tmp_path / 'x.db'}"
    open_storage(url).engine.dispose()  # a new file: Optuna stamps its tables with the newest schema
    reads = []
    from_config = alembic.script.ScriptDirectory.from_config.__func__
    monkeypatch.setattr(
        alembic.script.ScriptDirectory,
        "from_config",
        classmethod(lambda cls, config: reads.append(1) or from_config(cls, config)),
    )
    for _ in range(3):
        open_storage(url, create=False).engine.dispose()
    assert len(reads) <= 1


@pytest.mark.parametrize(
    ("stamped", "advice"),
    [
        ("v3.0.0.d", "run `optuna storage upgrade --storage sqlite:///{path}` (back it up first)"),
        ("v9.9.9.z", "made by a newer Optuna than this one"),
    ],
)
def test_a_storage_of_another_optuna_schema_is_refused_in_one_line_saying_what_to_do(tmp_path, stamped, advice):
    import sqlite3

    path = tmp_path / "old.db"
    open_storage(f"sqlite:///{path}").engine.dispose()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE alembic_version SET version_num = ?", (stamped,))
    with pytest.raises(UsageError) as refused:
        open_storage(f"sqlite:///{path}", create=False)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"storage sqlite:///{path}: ")
    assert stamped in message and advice.format(path=path) in message


def test_passwords_never_show():
    with pytest.raises(UsageError) as err:
        load_ref("postgresql://tuner:s3cret@127.0.0.1:1/autotune#x")
    assert "s3cret" not in str(err.value) and "***" in str(err.value)


@pytest.mark.postgres
def test_postgres_fixture_reaches_a_real_server(postgres):
    import psycopg2

    conn = psycopg2.connect(postgres.url)
    with conn.cursor() as cur:
        cur.execute("SELECT version()")
        assert "PostgreSQL" in cur.fetchone()[0]
    conn.close()


@pytest.mark.postgres
def test_workers_starting_together_on_a_fresh_database_all_get_its_tables(postgres):
    """Optuna creates its tables on first use; workers starting at once race to do it (one
    wins, the others hit duplicate-key errors): open_storage tries again."""
    url = postgres.fresh_database()
    errors = run_together(4, lambda: open_storage(url, grace_period_s=default_grace_period_s()))
    assert not errors, errors


HEARTBEAT_WORKER = textwrap.dedent("""
    import sys, time, optuna
    from autotune.study.storage import default_grace_period_s, open_storage
    storage = open_storage(sys.argv[1], grace_period_s=default_grace_period_s())
    study = optuna.load_study(study_name=sys.argv[2], storage=storage)
    def objective(trial):
        trial.suggest_int("x", 0, 9)
        trial.suggest_categorical("worker", ["A"])  # B never suggests it: a retry's params are A's
        trial.set_user_attr("host", "another-host")  # not this host: only its heartbeat can tell
        trial.set_user_attr("reference", "baseline")  # describes the configuration: the retry keeps it
        print("running", trial.number, flush=True)
        time.sleep(600)
    study.optimize(objective, n_trials=1)
""")


@pytest.mark.postgres
@pytest.mark.process
def test_heartbeat_fails_and_retries_a_killed_workers_trial(postgres, tmp_path, monkeypatch):
    """Worker A (a process with autotune's storage settings) is killed with -9 mid-trial. Worker B
    calls optimize, which runs fail_stale_trials first: after the grace period A's trial is FAIL
    and its retry (same parameters) runs in B. AUTOTUNE_HEARTBEAT_S=1: grace = 4 s."""
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")
    url, name = postgres.url, f"hb-{uuid.uuid4().hex[:6]}"
    storage = open_storage(url, grace_period_s=default_grace_period_s())
    assert (storage.heartbeat_interval, storage.grace_period) == (1, 4)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    a = subprocess.Popen(
        [sys.executable, "-c", HEARTBEAT_WORKER, url, name],
        env=repo_env(AUTOTUNE_HEARTBEAT_S="1"),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert a.stdout.readline().startswith("running 0")
    time.sleep(1.5)  # a few heartbeats recorded
    a.kill()
    killed_at = time.monotonic()
    a.wait()
    failed_at = None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    while time.monotonic() - killed_at < 30:
        study.optimize(lambda t: float(t.suggest_int("x", 0, 9)), n_trials=1)  # B: one trial at a time
        trials = study.get_trials()
        if trials[0].state == TrialState.FAIL:
            failed_at = time.monotonic()
            break
    assert failed_at is not None, "the killed worker's trial was never failed"
    retry = [t for t in study.get_trials() if t.system_attrs.get("failed_trial") == 0]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE
    # A's parameters (its "worker" included, which B's objective never suggests), run by B's
    # objective (its value is x), keeping the attrs that describe the configuration, not the
    # dead attempt's (RetryStaleTrial).
    assert retry[0].params == trials[0].params and retry[0].params["worker"] == "A"
    assert retry[0].value == float(trials[0].params["x"])
    assert trials[0].user_attrs == {"host": "another-host", "reference": "baseline"}
    assert retry[0].user_attrs == {"reference": "baseline"}
    print(
        f"\nheartbeat 1 s, grace 4 s: killed worker's trial failed and retried {failed_at - killed_at:.1f} s "
        f"after the kill (defaults: heartbeat 30 s, grace {4 * 30} s)"
    )
    # Not before the grace period (the last beat came up to 1 s before the kill); after it, at
    # B's next optimize call: 16 s of slack for a loaded 2-core machine, where B, the database
    # and the dying A share the cores, and well inside the loop's 30 s.
    assert 3 <= failed_at - killed_at < 4 + 16


def test_heartbeat_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("AUTOTUNE_HEARTBEAT_S", raising=False)
    assert default_grace_period_s() == 120
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "5")
    assert default_grace_period_s() == 20
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "soon")
    with pytest.raises(UsageError, match="AUTOTUNE_HEARTBEAT_S: expected a whole number of seconds"):
        default_grace_period_s()


def test_retry_keeps_the_reference_and_drops_the_attempt():
    study = optuna.create_study()
    study.enqueue_trial({}, user_attrs={"reference": "baseline"})
    trial = study.ask()
    trial.set_user_attr("tuner_pid", 12345)
    study.tell(trial, state=TrialState.FAIL)
    RetryStaleTrial(max_retry=1)(study, study.trials[0])
    (retry,) = study.get_trials(states=(TrialState.WAITING,))
    assert retry.user_attrs == {"reference": "baseline"} and retry.system_attrs["failed_trial"] == 0
    # The retry failing in turn is not retried again: once is the limit.
    retried = study.ask()
    assert retried.number == retry.number
    study.tell(retried, state=TrialState.FAIL)
    RetryStaleTrial(max_retry=1)(study, study.trials[retry.number])
    assert study.get_trials(states=(TrialState.WAITING,)) == []


def test_redact_hides_both_places_a_password_can_be():
    assert redact("postgresql://tuner:secret@db/autotune") == "postgresql://tuner:***@db/autotune"
    assert redact("postgresql+psycopg2://u:p/w:x@h:5/d") == "postgresql+psycopg2://u:***@h:5/d"
    assert (
        redact("postgresql://u@h/d?sslmode=require&password=secret")
        == "postgresql://u@h/d?sslmode=require&password=***"
    )
    assert redact("journal:studies/x.journal") == "journal:studies/x.journal"


@pytest.mark.postgres
@pytest.mark.process
def test_the_password_never_shows_in_output_logs_recipes_or_reports(postgres_two_workers):
    run = postgres_two_workers
    password = run.url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    assert password
    show = run_autotune("-v", "show", "--study", run.study, "--storage", run.url, "--json", cwd=run.cwd)
    export = run_autotune(
        "-v", "export", "--study", run.study, "--storage", run.url, "-o", "exported.json", cwd=run.cwd
    )
    report = run_autotune("-v", "report", "--study", run.study, "--storage", run.url, "--out", "report", cwd=run.cwd)
    assert show.returncode == export.returncode == report.returncode == 0, show.stderr + export.stderr + report.stderr
    assert (run.cwd / "report" / "report.md").exists()
    texts = [r.stdout + r.stderr for r in [*run.results, show, export, report]]
    texts += [p.read_text(errors="replace") for p in run.cwd.rglob("*") if p.is_file()]
    assert all(password not in text for text in texts)
    recipe = json.loads((run.cwd / "recipes" / f"{run.study}.json").read_text())
    assert recipe["study"]["storage"] == redact(run.url) and "***" in recipe["study"]["storage"]
    assert json.loads(show.stdout)["study"] == run.study


# --- a live worker's trial, judged from another host ---------------------------------------------------------


def held_tuner(postgres, where: Path, name: str, n_trials: int) -> subprocess.Popen:
    """Worker A: `autotune search` on PostgreSQL in `where`, a heartbeat a second (grace 4 s), its
    trials faked (tests.faked_tuner): the first waits for where/go, after writing where/running."""
    where.mkdir(exist_ok=True)
    env = with_site(where, SITE, FAKE_HOLD_DIR=str(where), AUTOTUNE_HEARTBEAT_S="1")
    tuner = start_tuner(
        *search_args(postgres.url, name, n_trials, "--no-confirm"), "--memory-limit", "1GiB", cwd=where, env=env
    )
    wait_for(lambda: (where / "running").exists() or tuner.poll() is not None, 120, "A's first trial")
    assert tuner.poll() is None, tuner.communicate()[1][-3000:]
    return tuner


def running_trial(url: str, name: str) -> FrozenTrial:
    (trial,) = [t for t in load(url, name).trials if t.state == TrialState.RUNNING]
    return trial


@pytest.mark.postgres
@pytest.mark.process
def test_a_worker_paused_past_the_grace_period_leaves_its_trial_to_the_retry_and_goes_on(
    postgres, tmp_path, monkeypatch
):
    """A is stopped (SIGSTOP) mid-trial; B fails A's trial once its heartbeat has stood still for
    the grace period, and queues its retry. A, resumed, finds its trial failed: it writes nothing
    over it, says so in one line and goes on with its next trials."""
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")  # B's too: grace 4 s
    name = f"paused-{uuid.uuid4().hex[:6]}"
    a = held_tuner(postgres, tmp_path, name, 3)
    held = running_trial(postgres.url, name)
    os.kill(a.pid, signal.SIGSTOP)
    try:
        b = optuna.load_study(study_name=name, storage=open_storage(postgres.url, grace_period_s=4))
        with _quiet():
            wait_for(lambda: fail_stale(b, held.number), 60, "B failing A's trial")
    finally:
        os.kill(a.pid, signal.SIGCONT)
    (tmp_path / "go").touch()
    done = finish(a, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if f"trial {held.number}:" in line]
    assert said == [
        f"WARNING autotune.search.optimize: trial {held.number}: another worker failed it while this worker was "
        "stopped for longer than the heartbeat grace period, and queued it again; this result (1,000 tok/s) is "
        "not recorded"
    ]
    trials = load(postgres.url, name).trials
    assert trials[held.number].state == TrialState.FAIL and "outcome" not in trials[held.number].user_attrs
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == held.number]
    assert retry.state == TrialState.COMPLETE and retry.params == held.params
    assert sum(t.user_attrs.get("tuner_pid") == a.pid for t in trials if t.state == TrialState.COMPLETE) == 2


def fail_stale(study: optuna.Study, number: int) -> bool:
    """B's check (as before each of its trials): True once trial `number` is failed."""
    optuna.storages.fail_stale_trials(study)
    return study.trials[number].state == TrialState.FAIL


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


# Worker B's clocks a day ahead: Python's (time, datetime), and the database's as B's session
# reads it (PGTZ: PostgreSQL's now() and the heartbeats it writes are in the session's zone;
# 23:59 ahead, as Python's tzinfo, which psycopg2 makes of it, stops short of a day).
SKEWED_CLOCK = textwrap.dedent("""
    import datetime, time
    DAY = 86400.0
    _time = time.time
    time.time = lambda: _time() + DAY
    class _Ahead(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime.fromtimestamp(_time() + DAY, tz)
    datetime.datetime = _Ahead
""")
SKEWED_CHECKER = textwrap.dedent("""
    import sys, time, warnings, optuna, sqlalchemy
    from autotune.study.storage import GRACE_INTERVALS, default_grace_period_s, open_storage
    warnings.simplefilter("ignore")
    url, name, number = sys.argv[1], sys.argv[2], int(sys.argv[3])
    storage = open_storage(url, grace_period_s=default_grace_period_s())
    study = optuna.load_study(study_name=name, storage=storage)
    trial_id = study.trials[number]._trial_id
    beats, last = 0, None
    while beats <= GRACE_INTERVALS + 1 and study.trials[number].state.name == "RUNNING":  # past the grace
        optuna.storages.fail_stale_trials(study)  # as before each of its own trials
        with storage.engine.connect() as db:
            beat = db.execute(sqlalchemy.text("SELECT heartbeat FROM trial_heartbeats WHERE trial_id = :t"),
                              {"t": trial_id}).scalar()
        beats, last = beats + (beat != last), beat
        time.sleep(0.2)
    print(study.trials[number].state.name, flush=True)
""")


@pytest.mark.postgres
@pytest.mark.process
def test_a_worker_whose_clock_runs_a_day_ahead_never_fails_a_live_trial(postgres, tmp_path):
    """B, a day ahead, checks A's live trial for stale heartbeats before each of its trials (here
    over and over, while it sees A's heartbeat change six times: longer than the grace period of
    four beats): the trial is left alone, and A completes it."""
    name = f"skew-{uuid.uuid4().hex[:6]}"
    a = held_tuner(postgres, tmp_path / "a", name, 1)
    held = running_trial(postgres.url, name)
    b_env = with_site(tmp_path / "b", SKEWED_CLOCK, AUTOTUNE_HEARTBEAT_S="1", PGTZ="UTC-23:59")
    b = subprocess.run(
        [sys.executable, "-c", SKEWED_CHECKER, postgres.url, name, str(held.number)],
        env=b_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (tmp_path / "a" / "go").touch()
    done = finish(a, timeout=300)
    assert b.stdout == "RUNNING\n", b.stderr[-3000:]
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert load(postgres.url, name).trials[held.number].state == TrialState.COMPLETE
