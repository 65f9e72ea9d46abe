"""SIGTERM and SIGHUP stop a search as Ctrl-C does (issue 14, item 7): SIGTERM is what
`timeout`, systemd, Slurm and Kubernetes send, SIGHUP what a closed terminal sends. The
running trial is recorded `interrupted`, the best-so-far recipe is written, the trial's
temporary folder is removed, and the exit status is 128 + the signal (143, 129; Ctrl-C 130).
A stop anywhere else, `verify` included, is one line and 130, never click's "Aborted!" and 1
(item 8). Pressing Ctrl-C again while the tuner stops changes nothing (issue E), and the
fork server a command started never answers a terminal's Ctrl-C itself."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner, Result
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.device import descendants
from autotune.measure import outcomes
from autotune.recipe.recipe import Recipe
from autotune.search.run import run_search
from autotune.study.storage import open_storage
from autotune.trial.runner import TrialResult
from tests.attack_helpers import FAST, fake_trials, measurement, repo_env, settings
from tests.helpers import hold_a_running_trial, parent_of, start_tuner, wait_for

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.process
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_a_search_like_ctrl_c(tmp_path, monkeypatch, sig, code):
    # A study whose reference trials are done (faked, in this process): the tuner below resumes
    # it and runs real trials, so the best so far exists when the signal comes.
    monkeypatch.chdir(tmp_path)
    url = f"journal:{tmp_path / 's.journal'}"
    with monkeypatch.context() as m:
        fake_trials(m)
        run_search(settings(storage=url, study="s", n_trials=2))
    (tmp_path / "recipes" / "s.json").unlink()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    tuner = subprocess.Popen(
        [sys.executable, "-m", "autotune", "search", *FAST, "--storage", url, "--study", "s", "--n-trials", "5"],
        cwd=tmp_path,
        env=repo_env(TMPDIR=str(scratch)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    running = hold_a_running_trial(url, "s", tuner)
    assert list(scratch.glob("autotune-trial-*")), "the running trial has its temporary folder"
    tuner.send_signal(sig)
    out, err = tuner.communicate(timeout=60)
    assert tuner.returncode == code, err[-3000:]
    name = signal.Signals(sig).name
    assert err.strip().splitlines()[-1].startswith(f"Error: stopped by {name}: the running trial was stopped"), err
    trial = optuna.load_study(study_name="s", storage=open_storage(url, create=False)).trials[running.number]
    assert trial.state == TrialState.FAIL and trial.user_attrs["outcome"] == outcomes.INTERRUPTED
    assert name in trial.user_attrs["reason"]
    recipe = json.loads((tmp_path / "recipes" / "s.json").read_text())
    assert recipe["study"]["name"] == "s"
    assert not list(scratch.glob("autotune-trial-*")), "the trial's temporary folder was left behind"


def test_ctrl_c_in_verify_is_one_line_and_130(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = Recipe(
        config=TrainConfig(), model={"name": "gpt2-tiny", "seq_len": 128}, measured={"tokens_per_sec": 1000.0}
    ).save(tmp_path / "r.json")

    def pressed_ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("autotune.recipe.verify.run_trial", pressed_ctrl_c)
    result = CliRunner().invoke(main, ["verify", str(path), "--device", "cpu"])
    assert result.exit_code == 130, (result.exit_code, result.output)
    assert result.stderr == "Error: interrupted (Ctrl-C)\n" and result.stdout == ""


def fork_server_of(pid: int) -> int | None:
    """The fork server a tuner (or `verify`) started, once it runs: its child `python -c`
    running multiprocessing.forkserver."""
    for child in descendants(pid):
        try:
            if parent_of(child) == pid and b"multiprocessing.forkserver" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
        except OSError:
            continue
    return None


def importing_torch(pid: int) -> bool:
    """Whether the process has loaded torch's library: the fork server then imports torch's
    Python modules and dynamo for seconds more before it serves its first trial."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.process
def test_ctrl_c_in_verify_is_one_line_from_the_fork_server_too(tmp_path):
    # A terminal's Ctrl-C goes to the whole foreground process group: `verify` and the fork
    # server it started, which was still importing torch and printed a KeyboardInterrupt
    # traceback after verify's one line.
    path = Recipe(
        config=TrainConfig(), model={"name": "gpt2-tiny", "seq_len": 128}, measured={"tokens_per_sec": 1000.0}
    ).save(tmp_path / "r.json")
    verify = start_tuner("verify", str(path), "--device", "cpu", cwd=tmp_path)  # a group of its own, as a shell's job
    server = wait_for(lambda: fork_server_of(verify.pid), 120, "verify to start its fork server", poll=0.01)
    wait_for(lambda: importing_torch(server), 120, "the fork server to load torch", poll=0.01)
    os.killpg(verify.pid, signal.SIGINT)  # the terminal's Ctrl-C
    out, err = verify.communicate(timeout=120)  # to the end of the server's output too: it shares the pipe
    assert verify.returncode == 130, err
    assert err == "Error: interrupted (Ctrl-C)\n" and out == ""


@pytest.mark.process
@pytest.mark.parametrize("presses, apart_s", [(4, 0.05), (6, 0.02)])
def test_a_burst_of_ctrl_c_stops_a_search_as_one_does(tmp_path, monkeypatch, presses, apart_s):
    # A user who presses Ctrl-C again and again while the tuner stops: the first press starts the
    # orderly stop, the others must not cut it short (the trial left RUNNING, no recipe, a
    # traceback from inside Optuna's recording of the trial).
    monkeypatch.chdir(tmp_path)
    url = f"journal:{tmp_path / 's.journal'}"
    with monkeypatch.context() as m:
        fake_trials(m)
        run_search(settings(storage=url, study="s", n_trials=2))
    (tmp_path / "recipes" / "s.json").unlink()
    tuner = subprocess.Popen(
        [sys.executable, "-m", "autotune", "search", *FAST, "--storage", url, "--study", "s", "--n-trials", "5"],
        cwd=tmp_path,
        env=repo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    running = hold_a_running_trial(url, "s", tuner)
    for _ in range(presses):  # the presses' pace is the fault: nothing waits on it
        tuner.send_signal(signal.SIGINT)
        time.sleep(apart_s)
    out, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("Error: interrupted: the running trial was stopped"), err
    assert "Traceback" not in err, err
    trial = optuna.load_study(study_name="s", storage=open_storage(url, create=False)).trials[running.number]
    assert trial.state == TrialState.FAIL and trial.user_attrs["outcome"] == outcomes.INTERRUPTED
    assert json.loads((tmp_path / "recipes" / "s.json").read_text())["study"]["name"] == "s"


def press_ctrl_c() -> None:
    """The user presses Ctrl-C: SIGINT to this thread at once (raise_signal, not os.kill: the
    kernel would send a process's signal to any of its threads), handled as it would be."""
    signal.raise_signal(signal.SIGINT)


class PressesDuringTheStop:
    """Ctrl-C pressed on the third trial, then again at the start of each function named, once
    the stop has begun: where a second press lands while the tuner records the trial and
    writes the recipe."""

    def __init__(self, monkeypatch, *targets: str) -> None:
        self.pressed = 0
        for target in targets:
            module, name = target.rsplit(".", 1)
            monkeypatch.setattr(target, self._pressing(getattr(importlib.import_module(module), name)))
        calls = []

        def run_trial(spec, cfg, **kwargs):
            calls.append(cfg)
            if len(calls) == 3:
                self.press()
                raise AssertionError("the Ctrl-C did not stop the trial")
            m = measurement(cfg, tokens_per_sec=float(cfg.token_budget))
            return TrialResult(m.outcome, m.reason, m, 0.1, {"total": 0.1})

        monkeypatch.setattr("autotune.search.training.run_trial", run_trial)

    def press(self) -> None:
        self.pressed += 1
        press_ctrl_c()

    def _pressing(self, real):
        def again(*args, **kwargs):
            if self.pressed:
                self.press()
            return real(*args, **kwargs)

        return again


def search_to_a_stop(tmp_path, monkeypatch) -> tuple[Result, optuna.Study]:
    monkeypatch.chdir(tmp_path)
    url = f"journal:{tmp_path / 's.journal'}"
    result = CliRunner().invoke(main, ["search", *FAST, "--storage", url, "--study", "s", "--n-trials", "5"])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the command put it back
    return result, optuna.load_study(study_name="s", storage=open_storage(url, create=False))


def assert_stopped_in_order(result: Result, study: optuna.Study, tmp_path) -> None:
    assert result.exit_code == 130, (result.exit_code, result.output, result.exc_info)
    assert result.stderr.splitlines()[-1] == (
        "Error: interrupted: the running trial was stopped and recorded; the best so far is in recipes/s.json"
    )
    assert "Traceback" not in result.stderr and result.stderr.count("Error:") == 1, result.stderr
    stopped = study.trials[2]
    assert stopped.state == TrialState.FAIL and stopped.user_attrs["outcome"] == outcomes.INTERRUPTED
    assert "Ctrl-C" in stopped.user_attrs["reason"]
    assert len(study.trials) == 3  # no trial after the stop
    assert json.loads((tmp_path / "recipes" / "s.json").read_text())["study"]["name"] == "s"


def test_ctrl_c_pressed_again_while_the_tuner_stops_is_absorbed(tmp_path, monkeypatch):
    # Each press lands at the worst moment: while the trial is recorded interrupted, inside
    # Optuna's recording of its end (its finally then failed with UnboundLocalError, the trial
    # left RUNNING), and while the recipe is written.
    presses = PressesDuringTheStop(
        monkeypatch,
        "autotune.study.record.write_stopped",
        "optuna.study._optimize._tell_with_warning",
        "autotune.search.run.write_recipe",
    )
    result, study = search_to_a_stop(tmp_path, monkeypatch)
    assert presses.pressed == 4
    assert_stopped_in_order(result, study, tmp_path)


def test_a_ctrl_c_inside_optunas_recording_of_a_trial_still_stops_in_order(tmp_path, monkeypatch):
    # One press, landing while Optuna records a trial that ended by itself: the KeyboardInterrupt
    # broke Optuna's bookkeeping (UnboundLocalError from its finally) and the trial stayed RUNNING.
    tells = []
    real = optuna.study._optimize._tell_with_warning

    def tell(*args, **kwargs):
        tells.append(kwargs.get("trial"))
        if len(tells) == 3:
            press_ctrl_c()
        return real(*args, **kwargs)

    monkeypatch.setattr("optuna.study._optimize._tell_with_warning", tell)
    fake_trials(monkeypatch)
    result, study = search_to_a_stop(tmp_path, monkeypatch)
    assert_stopped_in_order(result, study, tmp_path)
