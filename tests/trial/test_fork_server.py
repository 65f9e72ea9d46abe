"""Trials fork from one server per tuner (trial.fork_server), and fall back to a fresh interpreter
where the server cannot run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.config import RunSpec, TrainConfig
from autotune.device.memory import read_stat
from autotune.trial import fork_server, runner
from autotune.trial.probe import probe
from autotune.trial.runner import run_trial
from tests.helpers import ROOT

pytestmark = pytest.mark.process

SPEC = RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, min_time_s=0)
CFG = TrainConfig(token_budget=1024, batching="fixed")  # one shape to warm up: where a trial starts is the subject


def parents_of_trials(count: int) -> list[int]:
    parents: list[int] = []

    def on_start(pid: int) -> None:
        parents.append(read_stat(pid).ppid)

    for _ in range(count):
        assert run_trial(SPEC, CFG, timeout_s=120, on_start=on_start).outcome == "ok"
    return parents


def test_trials_fork_from_one_server_not_from_the_tuner(monkeypatch):
    monkeypatch.delenv("AUTOTUNE_TRIAL_START", raising=False)
    first, second = parents_of_trials(2)
    assert first == second != os.getpid()  # the server's children, both


def test_exec_starts_each_trial_as_a_child_of_the_tuner(monkeypatch):
    monkeypatch.setenv("AUTOTUNE_TRIAL_START", "exec")
    assert parents_of_trials(1) == [os.getpid()]


def test_a_forked_trial_starts_processes_as_a_fresh_interpreter_would(monkeypatch, tmp_path):
    # A trial's DataLoader workers start from multiprocessing's default context. Forked from the
    # fork server, a trial inherited the server's context: each worker then came from a second
    # fork server, an interpreter importing torch in the trial's tree (seconds of warm-up and
    # ~500 MiB of RSS a configuration with workers does not cost in `python train.py`).
    monkeypatch.delenv("AUTOTUNE_TRIAL_START", raising=False)
    monkeypatch.setenv("AUTOTUNE_TEST_REPORT", str(tmp_path / "report.json"))
    assert fork_server.fork_enabled()
    probe("tests.fixture_models:make_llama_reporting_its_process", timeout_s=120)
    report = json.loads((tmp_path / "report.json").read_text())
    # The probe was forked from the server (a fresh interpreter started by the tuner would pass
    # every check below without testing anything).
    assert report["factory_parent"] != os.getpid(), report
    fresh = "import multiprocessing; print(multiprocessing.get_start_method())"
    fresh_method = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, check=True).stdout
    fresh_method = fresh_method.strip()
    assert report["start_method"] == fresh_method, report
    # A DataLoader worker's parent, as in a fresh interpreter: the trial itself with fork (Linux
    # before Python 3.14) and spawn, never a second fork server started inside the trial; with
    # forkserver (the fresh default from 3.14), that server.
    if fresh_method == "forkserver":
        assert report["child_parent"] != report["factory_pid"], report
    else:
        assert report["child_parent"] == report["factory_pid"], report
    # Signals as a fresh interpreter has them: the server blocks SIGINT (a terminal's Ctrl-C is
    # its tuner's alone) and handles SIGTERM (its tuner's death); a trial does neither.
    assert report["blocked"] == [] and report["sigint"] == repr(signal.default_int_handler), report
    assert report["sigterm"] == repr(signal.SIG_DFL), report


def test_a_temp_dir_too_deep_for_the_servers_socket_runs_trials_all_the_same(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    code = (
        "import json; from autotune.config import RunSpec, TrainConfig; from autotune.trial.runner import run_trial;"
        "r = run_trial(RunSpec(model='gpt2-tiny', device='cpu', warmup=1, steps=2, min_time_s=0),"
        " TrainConfig(token_budget=1024, batching='fixed'), timeout_s=120); print(json.dumps([r.outcome, r.reason]))"
    )
    env = {**os.environ, "TMPDIR": str(deep), "PYTHONPATH": str(ROOT)}
    env.pop("AUTOTUNE_TRIAL_START", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["ok", None]


class _Asked(Exception):
    pass


def test_an_hf_models_trials_fork_from_a_server_that_imported_transformers(monkeypatch):
    # transformers costs ~10 s of CPU per process here: imported once in the server, not in the
    # probe and again in every trial.
    asked = []

    def recording(argv, *, env, cwd, output, preload=()):
        asked.append(list(preload))
        raise _Asked

    monkeypatch.setattr(runner.fork_server, "TrialProcess", recording)
    monkeypatch.setattr(runner.fork_server, "fork_enabled", lambda: True)
    for request in ({"model": "hf:gpt2-tiny"}, {"spec": {"model": "hf:gpt2-tiny"}}, {"model": "gpt2-tiny"}):
        with pytest.raises(_Asked):
            runner.run_child(["--probe"], request, timeout_s=5)
    assert asked == [fork_server.HF_PRELOAD, fork_server.HF_PRELOAD, []]
    assert "transformers" in fork_server.HF_PRELOAD


@pytest.mark.cuda_fakes
def test_a_trial_forked_from_the_server_measures_on_a_fake_gpu(tmp_path):
    """The fork server under the strict fakes (tests/cuda_fakes.py, installed in every interpreter
    by a sitecustomize, the server's included), which refuse CUDA in a process forked after its
    parent started CUDA, as torch does: the server never starts CUDA, so its trials (and their
    DataLoader workers, forked after the trial's CUDA started, which must not touch it) measure."""
    from tests.cuda_fakes import FakeMachine, child_env

    tuner = (
        "import json, os; from autotune.config import RunSpec, TrainConfig;"
        "from autotune.device.memory import read_stat; from autotune.trial.runner import run_trial; parents = [];"
        "r = run_trial(RunSpec(model='gpt2-tiny', device='cuda:0', warmup=0, steps=2, min_time_s=0),"
        " TrainConfig(token_budget=256, batching='fixed', num_workers=1), timeout_s=240,"
        " on_start=lambda pid: parents.append(read_stat(pid).ppid));"
        "print(json.dumps([r.outcome, r.reason, r.measurement and r.measurement.device['name'], parents, os.getpid()]))"
    )
    env = child_env(FakeMachine(), tmp_path, AUTOTUNE_TRIAL_START="fork")
    proc = subprocess.run([sys.executable, "-c", tuner], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome, reason, device, parents, tuner_pid = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (outcome, reason, device) == ("ok", None, "NVIDIA H200")
    assert parents and parents[0] != tuner_pid  # forked from the server, not started by the tuner


def test_a_temp_dir_too_deep_for_the_servers_socket_starts_trials_as_fresh_interpreters(monkeypatch):
    """The server's socket is "<temp dir>/pymp-XXXXXXXX/listener-XXXXXXXX" and a Unix socket's path
    stops at 107 bytes: a temp dir of 76-80 characters passed the old check (80) and failed at
    bind, a warning and a failed start in every search run from such a dir (a test's own tmp
    path under pytest-xdist is 80: it timed out there)."""
    import multiprocessing.connection
    import multiprocessing.util
    import shutil
    import tempfile

    from autotune.trial import fork_server

    def socket_path(directory: Path) -> str:
        monkeypatch.setattr(tempfile, "tempdir", str(directory))
        monkeypatch.setattr(multiprocessing.util, "get_temp_dir", lambda: tempfile.mkdtemp(prefix="pymp-"))
        return multiprocessing.connection.arbitrary_address("AF_UNIX")

    base = Path(tempfile.mkdtemp(dir="/tmp"))  # tmp_path itself is 76 characters or more under xdist
    try:
        deepest = base / ("d" * (fork_server.MAX_SOCKET_DIR - len(str(base)) - 1))
        deepest.mkdir()
        assert len(str(deepest)) == fork_server.MAX_SOCKET_DIR
        assert len(socket_path(deepest).encode()) <= 107  # it fits
        too_deep = base / ("d" * (fork_server.MAX_SOCKET_DIR - len(str(base))))
        too_deep.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(too_deep))
        assert not fork_server.fork_enabled()
    finally:
        shutil.rmtree(base)
