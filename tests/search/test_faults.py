"""Every trial outcome of a real search, with models that fail on purpose (tests/fault_models.py):
a segfault, a hang, a memory hog, an exception, and no configuration that fits. Each trial
is a real process: the tests keep to a tiny space, 4 timed steps and as few trials as prove
the point."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from autotune.measure import outcomes
from autotune.search.preflight import preflight
from autotune.search.run import run_search
from autotune.study.record import TrialRecord
from autotune.study.storage import load_study
from autotune.study.summary import summarize
from tests.helpers import (
    FAST,
    FINISHED,
    SPACES,
    STUDY,
    TINY_SPACE,
    group_alive,
    invoke,
    pid_alive,
    run_objective,
    search_settings,
    timeout_passes_once,
    wait_for,
)

pytestmark = pytest.mark.process


def test_segfault_is_crashed_and_the_search_goes_on(workdir):
    result = invoke(
        "search", "--model", "tests.fault_models:segfault", *FAST, "--n-trials", "2", "--space", str(TINY_SPACE)
    )
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "Error: no trial finished a measurement; no recipe written"
    trials = load_study("tests.fault_models-segfault-cpu", None).get_trials(states=FINISHED)
    assert len(trials) == 2  # the second trial ran after the first crashed
    for t in trials:
        assert t.state == TrialState.FAIL
        assert t.user_attrs["outcome"] == "crashed"
        reason = t.user_attrs["reason"]
        assert reason.startswith("killed by SIGSEGV"), reason
        assert "fault_models: about to segfault" in reason  # the stderr tail
    # Each finished trial's line, with its reason, in the progress (stderr: stdout is the summary).
    assert "#0   crashed" in result.stderr and "killed by SIGSEGV" in result.stderr
    assert not (workdir / "recipes").exists()


def test_hang_is_timeout_and_the_whole_group_is_killed(workdir, monkeypatch):
    pidfile = workdir / "child.pid"
    monkeypatch.setenv("AUTOTUNE_TEST_PIDFILE", str(pidfile))
    # The timeout passes once forward() has started its child: that child must die with the
    # trial's group. 120 s only bounds a trial that never gets there.
    timeout_passes_once(monkeypatch, pidfile.exists)
    result = invoke(
        "search",
        "--model",
        "tests.fault_models:hang",
        *FAST,
        "--n-trials",
        "1",
        "--space",
        str(TINY_SPACE),
        "--trial-timeout",
        "120s",
    )
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "Error: no trial finished a measurement; no recipe written"
    (trial,) = [t for t in load_study("tests.fault_models-hang-cpu", None).trials if t.state != TrialState.WAITING]
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["outcome"] == "timeout"
    assert trial.user_attrs["reason"] == "no result after 120 s; the process group was killed"
    child = int(pidfile.read_text())  # forward() ran and started its "DataLoader worker"
    wait_for(lambda: group_alive(trial.user_attrs["trial_pid"]) == [], 5, "the trial's process group to die", 0.1)
    assert not pid_alive(child)  # gone, or a zombie


# memory_hog's peak RSS on this CPU (autotune bench --json, 4 steps): ~380 MiB at 1024 tokens,
# ~1.3 GiB at 16384. The limit sits between them, and the large one stays under the runner's
# 1.5x watchdog, so it is measured to the end and recorded over the limit.
HOG_LIMIT = 1100 * 2**20


def test_over_memory_limit_is_infeasible_and_never_best(workdir):
    ctx = preflight(
        search_settings(
            model="tests.fault_models:memory_hog", space=str(SPACES / "memory.yaml"), memory_limit_bytes=HOG_LIMIT
        )
    ).task
    study = run_objective(ctx, [{"token_budget": 1024}, {"token_budget": 16384}])
    small, large = study.trials
    assert small.state == TrialState.COMPLETE and small.user_attrs["outcome"] == "ok", small.user_attrs
    assert small.user_attrs["peak_memory_bytes"] < HOG_LIMIT
    assert small.constraints["memory"] < 0 and TrialRecord.read(small).feasible
    assert large.state == TrialState.COMPLETE and large.user_attrs["outcome"] == "over_memory_limit", large.user_attrs
    peak = large.user_attrs["peak_memory_bytes"]
    assert HOG_LIMIT < peak < 1.5 * HOG_LIMIT
    assert (
        large.constraints["memory"]
        == pytest.approx((peak - HOG_LIMIT * (1 - outcomes.DEFAULT_MEMORY_HEADROOM)) / HOG_LIMIT)
        and large.constraints["memory"] > 0
    )
    feasible_peak = outcomes.feasible_peak_bytes(HOG_LIMIT, outcomes.DEFAULT_MEMORY_HEADROOM)
    assert large.user_attrs["reason"] == (
        f"peak memory {outcomes.format_bytes(peak)} is above the limit {outcomes.format_bytes(HOG_LIMIT)} "
        f"less 5% headroom ({outcomes.format_bytes(feasible_peak)})"
    )
    assert large.value == large.user_attrs["tokens_per_sec"] > 0  # measured: TPE learns from it
    assert not TrialRecord.read(large).feasible
    summary = summarize(study)
    assert summary.best.number == small.number
    assert summary.counts == {"ok": 1, "over_memory_limit": 1}


def test_raises_is_crashed_with_the_exception(workdir):
    result = run_search(search_settings(model="tests.fault_models:raises", n_trials=1))
    assert result.summary.best is None and result.recipe_path is None
    assert result.summary.counts == {"crashed": 1, "waiting": 1}  # the checklist
    trial = result.study.trials[0]
    assert trial.state == TrialState.FAIL and trial.user_attrs["reference"] == "baseline"
    reason = trial.user_attrs["reason"]
    assert reason.startswith("ValueError: boom\n"), reason
    assert "fault_models.py" in reason  # the traceback's tail
    assert trial.user_attrs["trial_pid"] and trial.user_attrs["wall_s"] > 0
    assert not (workdir / "recipes").exists()


def test_no_feasible_trial(workdir):
    # 1 MiB: the runner's RSS watchdog stops the trial at once; it is infeasible, not a crash.
    result = invoke(
        "search", "--model", "gpt2-tiny", *FAST, "--n-trials", "1", "--space", str(TINY_SPACE), "--memory-limit", "1MiB"
    )
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "Error: no trial fits the memory limit; no recipe written"
    assert "no trial fits the memory limit" in result.stdout
    (trial,) = [t for t in load_study(STUDY, None).trials if t.state != TrialState.WAITING]
    assert trial.state == TrialState.COMPLETE and trial.value == 0.0
    assert trial.user_attrs["outcome"] == "over_memory_limit"
    assert trial.user_attrs["reason"].endswith("passed 1.5x the limit 1.00 MiB; stopped early")
    assert trial.constraints == {"memory": 1.0}
    assert not (workdir / "recipes").exists()
