"""SIGTERM and SIGHUP stop a search as Ctrl-C does (issue 14, item 7): SIGTERM is what
`timeout`, systemd, Slurm and Kubernetes send, SIGHUP what a closed terminal sends. The
running trial is recorded `interrupted`, the best-so-far recipe is written, the trial's
temporary folder is removed, and the exit status is 128 + the signal (143, 129; Ctrl-C 130).
A stop anywhere else, `verify` included, is one line and 130, never click's "Aborted!" and 1
(item 8)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.device import descendants
from autotune.measure import outcomes
from autotune.recipe.recipe import Recipe
from autotune.search.run import run_search
from autotune.study.storage import open_storage
from tests.attack_helpers import FAST, fake_trials, repo_env, settings
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
