"""Every check happens before anything runs (issue 14, items 9, 11, 12, 13 and 14): a read-only
or full disk, a recipe path naming a folder, a memory limit that rounds to 0 bytes or overflows,
a bad --data, a model factory that raises, exits or hangs, a busy dashboard port. Each is one
line and exit 2, with nothing run and nothing written. A disk that fills up at the very end is
one line, exit 1, with no temporary file left. And `export`/`compare` say why a study has no
best instead of blaming the memory limit."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli import main
from tests.attack_helpers import FAST, fake_trials, files_under, in_repo_env, refused

optuna.logging.set_verbosity(optuna.logging.WARNING)


def search(*args: str):
    return CliRunner().invoke(main, ["search", *FAST, *args])


def read_only(monkeypatch, folder: Path) -> None:
    """Make `folder` refuse writes: for real (chmod) where permissions bind, else (root) by
    failing every open for writing under it with EROFS, as a read-only mount does."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return
    real_open = os.open
    inside = str(folder.resolve())

    def open_(path, flags, *args, **kwargs):
        if str(Path(path).resolve()).startswith(inside) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)


def full_disk(monkeypatch, folder: Path) -> None:
    real = os.statvfs
    inside = str(folder.resolve())

    class Full:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 0

    monkeypatch.setattr(
        os, "statvfs", lambda p: Full(real(p)) if str(Path(p).resolve()).startswith(inside) else real(p)
    )


# --- disks ------------------------------------------------------------------------------------------


def test_a_read_only_recipe_folder_is_refused_before_the_study(tmp_path, monkeypatch):
    (tmp_path / "ro").mkdir()
    read_only(monkeypatch, tmp_path / "ro")
    message = refused(tmp_path, monkeypatch, "search", *FAST, "--recipe", "ro/best.json")
    assert message.startswith("Error: recipe ro/best.json: cannot write in ro (")


@pytest.mark.slow
def test_resuming_in_a_read_only_studies_folder_is_refused_before_any_trial(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as m:
        fake_trials(m)
        assert search("--n-trials", "1").exit_code == 0
    read_only(monkeypatch, tmp_path / "studies")
    message = refused(tmp_path, monkeypatch, "search", *FAST, "--n-trials", "1")
    assert "storage sqlite:///studies/gpt2-tiny-cpu.db: cannot write in studies (" in message


def test_a_full_disk_is_refused_before_the_study(tmp_path, monkeypatch):
    full_disk(monkeypatch, tmp_path)
    message = refused(tmp_path, monkeypatch, "search", *FAST)
    assert "has 0 B free; autotune needs at least 16.00 MiB there" in message


def test_a_recipe_path_naming_a_folder_is_refused(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    assert "recipe out: is a folder; give a file name" in refused(
        tmp_path, monkeypatch, "search", *FAST, "--recipe", "out"
    )


@pytest.mark.slow
def test_a_disk_filling_up_at_the_end_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith(".json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    result = search("--n-trials", "1")
    assert result.exit_code == 1, (result.output, result.exception)
    assert (
        result.stderr.splitlines()[-1] == "Error: recipe recipes/gpt2-tiny-cpu.json: cannot write it (the disk is full)"
    )
    assert [p for p in files_under(tmp_path) if p.endswith(".tmp")] == []


# --- limits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, said",
    [
        (["--memory-limit", "0.5"], "--memory-limit: '0.5' is 0 B; a memory limit must be at least 1 MiB"),
        (["--memory-limit", "1e400"], "--memory-limit: '1e400' is more memory than any machine has"),
        (["--memory-fraction", "1e-12"], "--memory-fraction 1e-12 of"),
        (["--trial-timeout", "nan"], "--trial-timeout: cannot read 'nan' as a duration"),
        (["--min-time", "inf"], "--min-time: expected a number from 0 to 3600, got 'inf'"),
        (["--min-time", "1e9"], "--min-time: expected a number from 0 to 3600, got '1e9'"),
    ],
)
def test_limits_that_round_to_nothing_or_overflow_are_refused(tmp_path, monkeypatch, args, said):
    assert said in refused(tmp_path, monkeypatch, "search", *FAST, *args)


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_a_seed_out_of_range_is_refused_before_the_study_is_created(tmp_path, monkeypatch, seed):
    """`--seed -1` gave numpy's traceback from the sampler and left an empty study database."""
    said = refused(tmp_path, monkeypatch, "search", *FAST, "--seed", seed)
    assert said == f"Error: --seed: expected a whole number from 0 to 4294967295, got '{seed}'\n"


@pytest.mark.parametrize("seed", [-1, 2**32, True])
def test_run_search_refuses_a_seed_out_of_range_and_writes_nothing(tmp_path, monkeypatch, seed):
    from autotune.errors import UsageError
    from autotune.search.run import run_search
    from tests.attack_helpers import settings

    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    with pytest.raises(UsageError, match="seed must be an integer"):
        run_search(settings(seed=seed, n_trials=1))
    assert files_under(tmp_path) == set()


# --- data and factories --------------------------------------------------------------------------------


def test_a_missing_data_file_is_refused_before_the_study(tmp_path, monkeypatch):
    """It used to be found by the first trial, after the study was locked to the bad path."""
    message = refused(tmp_path, monkeypatch, "search", *FAST, "--data", "nope.txt")
    assert message == "Error: data file nope.txt not found\n"


@pytest.mark.process
def test_a_data_file_that_cannot_be_read_is_refused_before_the_study(tmp_path, monkeypatch):
    (tmp_path / "docs.jsonl").write_text('{"text": "fine"}\nnot json\n')
    message = refused(tmp_path, monkeypatch, "search", *FAST, "--data", "docs.jsonl")
    assert message == 'Error: docs.jsonl:2: invalid JSON (Expecting value); expected an object with a "text" string\n'


@pytest.mark.process
@pytest.mark.parametrize(
    "factory, timeout, said",
    [
        # 8 s: time to start the probe and get this far on a loaded machine.
        ("factory_raises", "8s", "building it raised ValueError: factory boom"),
        ("factory_exits", "8s", "exited with status 0 before the model was built"),
        # The factory never returns, however long the probe waits: an idle wait, kept short.
        ("factory_hangs", "3s", "building it took longer than 3 s (the trial timeout)"),
    ],
)
def test_a_factory_that_raises_exits_or_hangs_is_one_line(tmp_path, monkeypatch, factory, timeout, said):
    in_repo_env(monkeypatch)
    args = [a if a != "gpt2-tiny" else f"tests.attack_models:{factory}" for a in FAST]
    assert said in refused(tmp_path, monkeypatch, "search", *args, "--trial-timeout", timeout)


@pytest.mark.process
def test_a_factory_that_allocates_beyond_the_limit_is_stopped_in_one_line(tmp_path, monkeypatch):
    """The probe that first builds a user's factory had no memory guard: a factory allocating
    20 GiB under --memory-limit 1GiB grew until a cgroup killed it (and the tuner with it)."""
    in_repo_env(monkeypatch)
    args = [a if a != "gpt2-tiny" else "tests.fault_models:host_hog" for a in FAST]
    said = refused(tmp_path, monkeypatch, "search", *args, "--memory-limit", "256MiB", "--trial-timeout", "60s")
    assert "building it took more than 384.00 MiB of memory (1.5x the memory limit 256.00 MiB)" in said, said


# --- the dashboard --------------------------------------------------------------------------------------


def test_the_dashboard_on_a_busy_or_invalid_port_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("optuna_dashboard")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        message = refused(tmp_path, monkeypatch, "dashboard", "--storage", "x.db", "--port", str(port))
        assert message == f"Error: --port {port}: 127.0.0.1:{port} is in use by another program; choose another port\n"
    result = CliRunner().invoke(main, ["dashboard", "--storage", "x.db", "--port", "70000"])
    assert result.exit_code == 2
    assert result.output == "Error: --port: expected a whole number from 1 to 65535, got '70000'\n"


# --- a study without a best -------------------------------------------------------------------------------


def studies_without_a_best(tmp_path: Path) -> tuple[str, str]:
    empty, crashed = f"sqlite:///{tmp_path / 'empty.db'}", f"sqlite:///{tmp_path / 'crashed.db'}"
    optuna.create_study(study_name="empty", storage=empty, direction="maximize")
    study = optuna.create_study(study_name="crashed", storage=crashed, direction="maximize")
    for _ in range(2):
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState.FAIL, user_attrs={"outcome": "crashed", "reason": "killed by SIGSEGV"}
            )
        )
    return empty, crashed


@pytest.mark.slow
def test_export_and_compare_say_why_there_is_no_best(tmp_path, monkeypatch):
    empty, crashed = studies_without_a_best(tmp_path)
    message = refused(tmp_path, monkeypatch, "export", "--storage", empty, "--study", "empty")
    assert message == "Error: study 'empty' has no best trial (the study has no trials yet): nothing to export\n"
    message = refused(tmp_path, monkeypatch, "export", "--storage", crashed, "--study", "crashed")
    assert message == "Error: study 'crashed' has no best trial (no trial finished a measurement): nothing to export\n"
    result = CliRunner().invoke(main, ["compare", str(tmp_path / "empty.db"), str(tmp_path / "crashed.db")])
    assert result.exit_code == 0, result.output
    assert "memory limit" not in result.output.split("each best configuration", 1)[1]
    assert "crashed has no best (no trial finished a measurement) to try elsewhere" in result.output
    assert "empty has no best (the study has no trials yet) to try elsewhere" in result.output
