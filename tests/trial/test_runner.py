"""autotune.trial.runner: a trial is a process that dies with its tuner. Ctrl-C of a real tuner
kills the running trial and records it interrupted; SIGKILL of the tuner kills its trial too,
and the same command resumes the study."""

from __future__ import annotations

import json
import shutil
import signal

import pytest
from optuna.trial import TrialState

from autotune.measure import outcomes
from tests.helpers import (
    FAST,
    FINISHED,
    TINY_SPACE,
    group_alive,
    hold_a_running_trial,
    killed_if_left,
    load,
    parent_of,
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
    trial_pid = running.user_attrs["trial_pid"]
    # The fork server the trial was forked from; the tuner where its temp dir is too deep for the
    # server's socket (as under pytest-xdist): the trial is then a fresh interpreter.
    server = parent_of(trial_pid)
    assert server is not None
    tuner.kill()  # SIGKILL: the tuner gets no say
    tuner.wait()
    # The trial is still held stopped: were it left to run, it would end by itself within a
    # second or two, and its end could pass for a death with the tuner. Stopped, only a kill
    # ends it. 5 s only bounds the wait; it dies within a fraction of one.
    with killed_if_left(trial_pid, server):
        wait_for(lambda: not pid_alive(trial_pid) and not pid_alive(server), 5, "the trial and its parent to die")
    tuner.communicate()  # the server and the trial held its pipes: read once they are gone
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


def test_sigkill_of_the_tuner_kills_the_fork_server_and_the_trials_whole_group(tmp_path):
    # A trial that runs on (a forward that never returns) with a child in its process group, as a
    # DataLoader worker would be: on a GPU the trial holds the device and its memory, and the
    # user reruns the command at once.
    pidfile = tmp_path / "child.pid"
    env = repo_env(AUTOTUNE_TEST_PIDFILE=str(pidfile))
    args = ["search", "--model", "tests.fault_models:hang", *FAST, "--space", str(TINY_SPACE)]
    tuner = start_tuner(*args, "--n-trials", "1", "--trial-timeout", "600s", cwd=tmp_path, env=env)

    def started() -> bool:
        assert tuner.poll() is None, tuner.communicate()[1][-3000:]
        return pidfile.exists()

    wait_for(started, 180, "the trial's forward to start its child")
    child = int(pidfile.read_text())
    trial = parent_of(child)
    server = parent_of(trial)
    assert server not in (None, tuner.pid)  # forked from the server, not from the tuner
    tuner.kill()
    tuner.wait()
    with killed_if_left(trial, server, child):
        wait_for(
            lambda: not any(map(pid_alive, (server, trial, child))) and group_alive(trial) == [],
            5,
            "the fork server, the trial and its process group to die with the tuner",
            poll=0.05,
        )
    tuner.communicate()


def test_sigkill_of_the_tuner_kills_a_fresh_interpreters_trial_still_starting(seeded, tmp_path):
    # AUTOTUNE_TRIAL_START=exec (also the fallback where the fork server cannot run): the trial
    # set its death signal only once its interpreter had started and imported. Held stopped
    # as soon as it exists, before that, it outlived its tuner.
    url, name = seeded
    tuner = start_tuner(*search_args(url, name, 8), cwd=tmp_path, env=repo_env(AUTOTUNE_TRIAL_START="exec"))
    trial_pid = hold_a_running_trial(url, name, tuner).user_attrs["trial_pid"]
    assert parent_of(trial_pid) == tuner.pid
    tuner.kill()
    tuner.wait()
    with killed_if_left(trial_pid):
        wait_for(lambda: not pid_alive(trial_pid), 5, "the trial to die with its tuner", poll=0.05)
    tuner.communicate()
