"""A disk the trials write to that fills up mid-study (issue E): the trial is recorded with the
full disk and the path named, the search stops in one line (exit 1) with the best so far
written, rather than burning every remaining trial on the same full disk. Injected without
filling a disk: a write that raises ENOSPC, in the tuner or in the trial process."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.device.disk import disk_full, disk_full_in
from autotune.measure import outcomes
from autotune.recipe.recipe import Recipe
from autotune.search.run import run_search
from autotune.study.storage import open_storage
from tests.attack_helpers import FAST, fake_trials, repo_env, settings
from tests.fault_env import BUILDS_ENV
from tests.helpers import run_autotune

NO_ROOM = os.strerror(errno.ENOSPC)


def requests_on_a_full_disk(monkeypatch) -> None:
    """The disk of the trials' folders is full now: writing a trial's request raises ENOSPC."""
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "request.json":
            raise OSError(errno.ENOSPC, NO_ROOM, str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


def test_a_full_disk_under_the_trials_folder_stops_the_search_with_the_best_so_far(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"journal:{tmp_path / 's.journal'}"
    with monkeypatch.context() as m:  # the reference trials, measured: a best so far
        fake_trials(m)
        run_search(settings(storage=url, study="s", n_trials=2))
    (tmp_path / "recipes" / "s.json").unlink()
    requests_on_a_full_disk(monkeypatch)
    result = CliRunner().invoke(main, ["search", *FAST, "--storage", url, "--study", "s", "--n-trials", "5"])
    assert result.exit_code == 1, (result.output, result.exc_info)
    last = result.stderr.splitlines()[-1]
    assert last.startswith("Error: the search stopped: no room on the disk: cannot write "), result.stderr
    assert f"request.json ({NO_ROOM})" in last and "the best so far is in recipes/s.json" in last
    assert "Traceback" not in result.stderr
    trials = optuna.load_study(study_name="s", storage=open_storage(url, create=False)).trials
    assert len(trials) == 3  # the one that met the full disk, and none after it
    full = trials[2]
    assert full.state == TrialState.FAIL and full.user_attrs["outcome"] == outcomes.INTERRUPTED
    assert full.user_attrs["reason"].startswith("no room on the disk: cannot write ")
    assert f"request.json ({NO_ROOM})" in full.user_attrs["reason"]
    assert json.loads((tmp_path / "recipes" / "s.json").read_text())["study"]["name"] == "s"


@pytest.mark.process
def test_a_trial_that_cannot_write_its_result_for_want_of_room_stops_the_search(tmp_path):
    # The trial process meets the full disk: writing its result fails. It was recorded
    # "crashed - exited with status 1", and every trial after it crashed the same way.
    env = repo_env(**{BUILDS_ENV: str(tmp_path / "builds")})
    url = f"journal:{tmp_path / 's.journal'}"
    model = ["--model", "tests.fault_models:full_disk"]
    done = run_autotune(
        "search", *model, *FAST[2:], "--storage", url, "--study", "s", "--n-trials", "3", cwd=tmp_path, env=env
    )
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.splitlines()[-1]
    assert last.startswith("Error: the search stopped: no room on the disk: cannot write "), done.stderr[-3000:]
    assert f"result.json.tmp ({NO_ROOM})" in last and "autotune-trial-" in last
    study = optuna.load_study(study_name="s", storage=open_storage(url, create=False))
    trials = study.get_trials(states=(TrialState.FAIL, TrialState.COMPLETE, TrialState.PRUNED))
    assert len(trials) == 1  # the baseline met the full disk; nothing ran after it
    assert trials[0].user_attrs["outcome"] == outcomes.INTERRUPTED
    assert "no room on the disk" in trials[0].user_attrs["reason"]


def test_no_room_is_told_from_the_error_or_from_what_a_process_printed():
    quota = os.strerror(errno.EDQUOT)
    assert (
        str(disk_full(OSError(errno.ENOSPC, NO_ROOM), "/t/f")) == f"no room on the disk: cannot write /t/f ({NO_ROOM})"
    )
    assert disk_full(OSError(errno.EDQUOT, quota, "/q")).path == "/q"
    assert disk_full(OSError(errno.EACCES, "Permission denied", "/p")) is None
    assert disk_full(ValueError("No space left on device")) is None
    printed = f"Traceback ...\nOSError: [Errno {errno.ENOSPC}] {NO_ROOM}: '/t/result.json.tmp'"
    assert disk_full_in(printed, "/t").path == "/t/result.json.tmp"
    assert disk_full_in(f"OSError: [Errno {errno.EDQUOT}] {quota}", "/t").path == "/t"
    assert str(disk_full_in(f"write failed: {NO_ROOM}")) == f"no room on the disk ({NO_ROOM})"  # C code's words
    assert disk_full_in("OSError: [Errno 2] No such file or directory: '/x'") is None


def test_verify_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = Recipe(config=TrainConfig(), model={"name": "gpt2-tiny", "seq_len": 128}, measured={"tokens_per_sec": 1e3})
    path = recipe.save(tmp_path / "r.json")
    requests_on_a_full_disk(monkeypatch)
    result = CliRunner().invoke(main, ["verify", str(path), "--device", "cpu"])
    assert result.exit_code == 1, (result.output, result.exc_info)
    assert result.stderr.startswith("Error: no room on the disk: cannot write ") and result.stderr.count("\n") == 1
    assert result.stderr.endswith(f"request.json ({NO_ROOM})\n"), result.stderr
