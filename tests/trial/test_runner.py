"""autotune.trial.runner: a trial is a process that dies with its tuner. Ctrl-C of a real tuner
kills the running trial and records it interrupted; SIGKILL of the tuner kills its trial too,
and the same command resumes the study."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
from optuna.trial import TrialState

from autotune.measure import outcomes
from tests.helpers import (
    FINISHED,
    hold_a_running_trial,
    load,
    pid_alive,
    repo_env,
    run_autotune,
    search_args,
    start_tuner,
    wait_for,
)

pytestmark = pytest.mark.process


def trial_folders(temp) -> list[str]:
    # multiprocessing's own folder (pymp-*, the fork server's socket) is not autotune's to remove
    return [p.name for p in temp.iterdir() if p.name.startswith("autotune-trial-")]


@pytest.fixture
def seeded(journal_two_workers, tmp_path) -> tuple[str, str]:
    """A copy of the two-worker journal study, whose reference trials are done: the tests below
    resume it without paying for the references again (the checklist's compile included)."""
    src = journal_two_workers.url[len("journal:") :]
    shutil.copy(src, tmp_path / "study.journal")
    return f"journal:{tmp_path / 'study.journal'}", journal_two_workers.study


def test_ctrl_c_kills_the_trial_records_it_interrupted_and_writes_the_best_recipe(seeded, tmp_path):
    url, name = seeded
    tuner = start_tuner(*search_args(url, name, 8), cwd=tmp_path)
    running = hold_a_running_trial(url, name, tuner)
    tuner.send_signal(signal.SIGINT)
    out, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 130, err[-3000:]
    assert "Error: interrupted" in err and err.strip().splitlines()[-1].startswith("Error: interrupted")
    trial = next(t for t in load(url, name).get_trials() if t.number == running.number)
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["outcome"] == outcomes.INTERRUPTED and "Ctrl-C" in trial.user_attrs["reason"]
    assert not pid_alive(running.user_attrs["trial_pid"]), "the trial process outlived the Ctrl-C"
    recipe = json.loads((tmp_path / "recipes" / f"{name}.json").read_text())
    assert recipe["format"] == "autotune.recipe" and recipe["study"]["name"] == name
    assert not any(t.state == TrialState.RUNNING for t in load(url, name).get_trials())


def test_sigkill_of_the_tuner_kills_its_trial_and_the_same_command_resumes(seeded, tmp_path):
    url, name = seeded
    temp = tmp_path / "tmp"  # the trials' folders, this test's alone
    temp.mkdir()
    env = repo_env(TMPDIR=str(temp))
    tuner = start_tuner(*search_args(url, name, 8), cwd=tmp_path, env=env)
    running = hold_a_running_trial(url, name, tuner)
    before = {t.number: t.state for t in load(url, name).get_trials()}
    tuner.kill()  # SIGKILL: the tuner gets no say
    tuner.wait()
    # Held stopped, the trial could not see its tuner die: let it run now (nobody is left to
    # record what it measures).
    os.kill(running.user_attrs["trial_pid"], signal.SIGCONT)
    tuner.communicate()
    # PR_SET_PDEATHSIG: the trial process dies with its tuner, it does not run on unattended.
    wait_for(lambda: not pid_alive(running.user_attrs["trial_pid"]), 10, "the trial process to die with its tuner")
    assert load(url, name).get_trials()[running.number].state == TrialState.RUNNING  # nobody could record it

    # The same command, one more trial (and no re-measurement of the leaders: not the subject).
    assert len(trial_folders(temp)) == 1  # the killed tuner's, left behind
    resumed = run_autotune(*search_args(url, name, 1, "--no-confirm"), cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert trial_folders(temp) == []  # removed by the resumed search (its own too)
    assert f"failed 1 trial(s) left running by a killed tuner: [{running.number}]" in resumed.stderr
    trials = load(url, name).get_trials()
    assert sorted(t.number for t in trials) == list(range(len(trials)))  # no number repeats
    killed = trials[running.number]
    assert killed.state == TrialState.FAIL and killed.user_attrs["outcome"] == outcomes.INTERRUPTED
    assert all(trials[n].state == state for n, state in before.items() if state in FINISHED)  # all kept
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == running.number]
    assert len(retry) == 1 and retry[0].state in FINISHED and retry[0].params == killed.params
    assert retry[0].user_attrs.get("tuner_pid") != killed.user_attrs.get("tuner_pid")
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)
