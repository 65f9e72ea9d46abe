"""Nothing a trial starts outlives it (issue 14, item 6), even a process that leaves the
trial's process group: a child started in a new session (setsid), killed with the trial at the
timeout, and a daemon (double fork: orphaned, new session) started by the model's factory,
killed when the trial ends normally. The runner uses no cgroup: a PID scan of the trial's
descendants while it runs, and an environment token swept when it ends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotune.config import RunSpec, TrainConfig
from autotune.measure import outcomes
from autotune.trial.runner import run_trial
from tests.attack_helpers import in_repo_env
from tests.helpers import timeout_passes_once

pytestmark = pytest.mark.process


def alive(pid: int) -> bool:
    """Running (a zombie is dead, only not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_dead(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def spec(model: str) -> RunSpec:
    return RunSpec(model=model, device="cpu", warmup=1, steps=2, min_time_s=0)


def test_a_child_in_a_new_session_dies_with_the_trial_at_the_timeout(tmp_path, monkeypatch):
    pidfile = tmp_path / "child.pid"
    monkeypatch.setenv("AUTOTUNE_TEST_PIDFILE", str(pidfile))
    in_repo_env(monkeypatch)
    timeout_passes_once(monkeypatch, pidfile.exists)  # once the child exists, as it does at a real timeout
    result = run_trial(spec("tests.attack_models:new_session_hang"), TrainConfig(token_budget=1024), timeout_s=120)
    assert result.outcome == outcomes.TIMEOUT, result.reason
    child = int(pidfile.read_text())
    assert wait_dead(child), f"pid {child}, started with setsid by the trial, outlived it"


def test_a_daemon_started_by_the_factory_dies_when_the_trial_ends(tmp_path, monkeypatch):
    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("AUTOTUNE_TEST_PIDFILE", str(pidfile))
    in_repo_env(monkeypatch)
    result = run_trial(spec("tests.attack_models:daemonizing"), TrainConfig(token_budget=1024), timeout_s=120)
    assert result.outcome == outcomes.OK, result.reason
    daemon = int(pidfile.read_text())
    assert wait_dead(daemon), f"pid {daemon}, a daemon the factory double-forked, outlived the trial"
