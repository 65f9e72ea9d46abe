"""autotune.search.fleet: several workers on one study. Two real `autotune search` processes on
a journal file and on PostgreSQL lose and duplicate nothing; --devices parses, pins one GPU
per worker by UUID, splits the trials, forwards Ctrl-C and dies with its parent."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from optuna.trial import TrialState, create_trial

import autotune.device
import autotune.search.fleet
import autotune.search.run
from autotune.config import TrainConfig
from autotune.search.fleet import (
    STORAGE_ENV,
    WorkerDevice,
    WorkerPlan,
    parse_devices,
    plan_workers,
    resolve_devices,
    split_trials,
    supervise,
    worker_command,
)
from autotune.study.urls import redact
from tests.helpers import (
    TINY_SPACE,
    TRIALS_PER_WORKER,
    SignalWhileLocked,
    TwoWorkers,
    assert_accounted,
    give_up_after,
    invoke,
    load,
    repo_env,
    wait_for,
)

FAKE_UUIDS = [
    "GPU-aaaa1111-0000-0000-0000-000000000000",
    "GPU-bbbb2222-0000-0000-0000-000000000000",
    "GPU-cccc3333-0000-0000-0000-000000000000",
    "GPU-dddd4444-0000-0000-0000-000000000000",
]


def test_devices_are_parsed_and_pinned_by_uuid():
    assert parse_devices("0, 1,3") == ["0", "1", "3"]
    devices = resolve_devices(["0", "1", "3"], FAKE_UUIDS)
    assert [(d.index, d.pin) for d in devices] == [(0, FAKE_UUIDS[0]), (1, FAKE_UUIDS[1]), (3, FAKE_UUIDS[3])]
    assert resolve_devices(["GPU-cccc"], FAKE_UUIDS) == [WorkerDevice(2, FAKE_UUIDS[2])]
    # Without NVML: the indices as given, pinned in PCI bus order.
    assert resolve_devices(["0", "2"], None) == [WorkerDevice(0, "0"), WorkerDevice(2, "2")]


@pytest.mark.parametrize(
    "text, uuids, message",
    [
        ("0,,1", FAKE_UUIDS, "expected GPU indices or UUIDs"),
        ("0,x", FAKE_UUIDS, "'x' is neither a GPU index"),
        ("1,1", FAKE_UUIDS, "1 given more than once"),
        ("7", FAKE_UUIDS, "GPU 7 does not exist; the GPUs here are 4 (0, 1, 2, 3)"),
        ("0,GPU-aaaa", FAKE_UUIDS, "the same GPU is given twice"),
        ("GPU-aaaa", None, "without NVML UUIDs cannot be matched"),
    ],
)
def test_bad_devices_are_one_clear_error(text, uuids, message):
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_devices(parse_devices(text), uuids)


def test_n_trials_is_the_total_split_evenly():
    assert split_trials(10, 4) == [3, 3, 2, 2]
    assert split_trials(4, 4) == [1, 1, 1, 1]
    assert split_trials(2, 4) == [1, 1, 0, 0]
    assert sum(split_trials(101, 8)) == 101


def test_worker_commands_pin_one_gpu_each_and_keep_the_password_off_the_command_line():
    settings = autotune.search.run.SearchSettings(
        model="gpt2",
        n_trials=10,
        space="my.yaml",
        seq_len=512,
        timeout_s=3600,
        warmup=2,
        steps=10,
        seed=3,
        recipe="out.json",
    )
    url = "postgresql://tuner:hunter2@db/autotune"
    devices = resolve_devices(["0", "1", "2", "3"], FAKE_UUIDS)
    plans = plan_workers(
        settings,
        devices,
        study="gpt2-h200-fleet",
        storage_url=url,
        memory_limit_bytes=123456789,
        trial_timeout_s=600.0,
        verbose=True,
    )
    assert [p.n_trials for p in plans] == [3, 3, 2, 2]
    for plan, gpu in zip(plans, FAKE_UUIDS):
        cmd = plan.command
        assert cmd[:5] == [sys.executable, "-m", "autotune", "-v", "search"] and "--worker" in cmd
        opts = dict(zip(cmd[5:], cmd[6:]))
        assert opts["--device"] == "cuda:0"  # the only GPU it can see
        assert opts["--study"] == "gpt2-h200-fleet" and opts["--memory-limit"] == "123456789"
        assert (
            opts["--trial-timeout"] == "600s"
            and opts["--timeout"] == "3600s"
            and opts["--n-trials"] == str(plan.n_trials)
        )
        assert (
            opts["--space"],
            opts["--seq-len"],
            opts["--warmup"],
            opts["--steps"],
            opts["--seed"],
            opts["--recipe"],
        ) == ("my.yaml", "512", "2", "10", "3", "out.json")
        assert "--storage" not in cmd and not any("hunter2" in part for part in cmd)
        assert plan.env == {
            "CUDA_VISIBLE_DEVICES": gpu,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            STORAGE_ENV: url,
            "PYTHONUNBUFFERED": "1",
        }
    # Fewer trials than GPUs: idle GPUs get no worker.
    assert (
        len(
            plan_workers(
                autotune.search.run.SearchSettings(n_trials=2),
                devices,
                study="s",
                storage_url=url,
                memory_limit_bytes=1,
                trial_timeout_s=1.0,
            )
        )
        == 2
    )


def test_worker_command_is_accepted_by_the_search_command(tmp_path):
    """The built command parses: run it with --help-free validation by pointing it at a bad
    model, which fails in preflight() with exit 2, after click accepted every option."""
    settings = autotune.search.run.SearchSettings(
        model="no-such-model", n_trials=1, space=str(TINY_SPACE), timeout_s=60
    )
    cmd = worker_command(settings, study="s", memory_limit_bytes=10**9, trial_timeout_s=30.0, n_trials=1)
    result = invoke(*cmd[3:], env={STORAGE_ENV: f"journal:{tmp_path / 'x.journal'}"})
    assert result.exit_code == 2 and "unknown model 'no-such-model'" in result.stderr, result.output


@pytest.mark.slow
def test_devices_parent_sets_up_the_study_once_warns_on_sqlite_and_sums_up(tmp_path, monkeypatch, caplog):
    """The --devices parent end to end, with four fake GPUs: NVML answers with fake UUIDs, the
    context is the CPU's, and the workers are not started (supervise is replaced): the study is
    set up before they would start, and the result sums up what they did (a trial recorded, one
    worker failed, one stopped by Ctrl-C) from the shared study and their exit codes."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(autotune.device, "visible_gpu_uuids", lambda: FAKE_UUIDS)
    real_preflight = autotune.search.run.preflight
    monkeypatch.setattr(
        autotune.search.run, "preflight", lambda s: real_preflight(s.__class__(**{**s.__dict__, "device": "cpu"}))
    )
    seen = {}

    def fake_supervise(plans):
        seen["plans"] = plans
        shared = load("sqlite:///studies/fleet.db", "fleet")
        seen["waiting_at_start"] = len(shared.get_trials(states=(TrialState.WAITING,)))
        config = TrainConfig(token_budget=1024).to_dict()
        attrs = {"config": config, "outcome": "ok", "tokens_per_sec": 5000.0, "peak_memory_bytes": 2**20}
        attrs["measurement"] = {"config": config, "outcome": "ok", "tokens_per_sec": 5000.0, "peak_memory_bytes": 2**20}
        shared.add_trial(create_trial(value=5000.0, params={}, distributions={}, user_attrs=attrs))  # a worker's
        return [0, 1, 0, 130], False

    monkeypatch.setattr(autotune.search.fleet, "supervise", fake_supervise)
    settings = autotune.search.run.SearchSettings(
        model="gpt2-tiny", n_trials=8, space=str(TINY_SPACE), study="fleet", memory_limit_bytes=2 * 1024**3
    )
    with caplog.at_level(logging.WARNING):
        result = autotune.search.fleet.run_workers(settings, "0,1,2,3")
    assert "4 workers on sqlite:///studies/fleet.db" in caplog.text and "journal:PATH" in caplog.text
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in seen["plans"]] == FAKE_UUIDS
    assert [p.n_trials for p in seen["plans"]] == [2, 2, 2, 2]
    assert seen["waiting_at_start"] == 2  # set up before any worker starts
    study = load("sqlite:///studies/fleet.db", "fleet")
    waiting = study.get_trials(states=(TrialState.WAITING,))
    # the two references, enqueued once, by the parent
    assert len(waiting) == 2 and study.user_attrs["identity"]
    assert [t.user_attrs.get("reference") for t in waiting] == ["baseline", "checklist"]
    assert result.new_study
    # Summed up: a worker's failure (status 1; 130 is a Ctrl-C, not a failure), and the shared
    # study as the workers left it, not as the parent set it up.
    assert result.worker_failures == [f"worker gpu1 ({FAKE_UUIDS[1]}) exited with status 1"]
    assert [r.status for r in result.summary.trials] == ["waiting", "waiting", "ok"]
    assert result.summary.best is not None and result.summary.best.number == 2  # the workers' trial
    assert result.stopped.text == "1 trial run"  # by the workers, counted after the references
    recipe = json.loads(Path(result.recipe_path).read_text())
    assert recipe["config"]["token_budget"] == 1024


SUPERVISED_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    def stop(*_):
        open(sys.argv[1], "w").write("interrupted")
        print("recorded the trial as interrupted", flush=True)
        sys.exit(130)
    signal.signal(signal.SIGINT, stop)
    print("a warning", file=sys.stderr, flush=True)  # before "ready": the test signals on "ready"
    print("ready", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
    time.sleep(120)
""")


SUPERVISOR = textwrap.dedent("""
    import json, sys
    from autotune.search.fleet import WorkerDevice, WorkerPlan, supervise
    child, tmp = sys.argv[1], sys.argv[2]
    plans = [WorkerPlan(WorkerDevice(i, f"GPU-{i}"), 1, [sys.executable, "-c", child, f"{tmp}/marker{i}"],
                        {"CUDA_VISIBLE_DEVICES": f"GPU-{i}"}) for i in range(2)]
    codes, interrupted = supervise(plans)
    print(json.dumps({"codes": codes, "interrupted": interrupted}), flush=True)
""")


def _start_supervisor(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, SUPERVISED_CHILD, str(tmp_path)],
        cwd=tmp_path,
        env=repo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_ready(proc: subprocess.Popen, n: int) -> list[str]:
    lines = []
    while sum("ready" in line for line in lines) < n:
        line = proc.stdout.readline()
        assert line, "the supervisor ended early"
        lines.append(line)
    return lines


@pytest.mark.process
def test_devices_parent_forwards_ctrl_c_and_waits_for_every_worker(tmp_path):
    proc = _start_supervisor(tmp_path)
    lines = _wait_ready(proc, 2)
    assert sorted(line.strip() for line in lines if "ready" in line) == ["[gpu0] ready GPU-0", "[gpu1] ready GPU-1"]
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert json.loads(out.strip().splitlines()[-1]) == {"codes": [130, 130], "interrupted": True}
    assert "[gpu0] recorded the trial as interrupted" in out and "[gpu1] a warning" in err
    assert all((tmp_path / f"marker{i}").read_text() == "interrupted" for i in range(2))


@pytest.mark.process
def test_a_ctrl_c_inside_popen_poll_does_not_hang_the_supervisor(monkeypatch):
    spawned = []

    def spawn_with_racing_lock(plan):
        proc = real_spawn(plan)
        proc._waitpid_lock = SignalWhileLocked()
        spawned.append(proc)
        return proc

    real_spawn = autotune.search.fleet._spawn
    monkeypatch.setattr(autotune.search.fleet, "_spawn", spawn_with_racing_lock)
    SignalWhileLocked.reset()
    plans = [
        WorkerPlan(WorkerDevice(i, f"GPU-{i}"), 1, [sys.executable, "-c", "import time; time.sleep(60)"], {})
        for i in range(2)
    ]
    try:
        with give_up_after(20, "the supervisor is still polling: a worker's exit went unseen"):
            codes, interrupted = supervise(plans, out=open(os.devnull, "w"), err=open(os.devnull, "w"))
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C escaped the supervisor")
    finally:
        for proc in spawned:
            proc.kill()
    assert interrupted and all(code not in (None, 0) for code in codes)


@pytest.mark.process
def test_devices_workers_stop_when_the_parent_is_killed(tmp_path):
    proc = _start_supervisor(tmp_path)
    _wait_ready(proc, 2)
    proc.kill()  # SIGKILL: no chance to forward anything; PR_SET_PDEATHSIG sends the workers SIGINT
    proc.wait()
    wait_for(lambda: all((tmp_path / f"marker{i}").exists() for i in range(2)), 20, "the workers to stop")


def check_two_workers(run: TwoWorkers) -> None:
    for r in run.results:
        assert r.returncode == 0, r.stderr[-3000:]
    trials = assert_accounted(load(run.url, run.study), 2 * TRIALS_PER_WORKER)
    assert len({t.user_attrs.get("tuner_pid") for t in trials}) == 2, "both workers ran trials"
    print(
        f"\n{redact(run.url).split(':', 1)[0]}: 2 workers x {TRIALS_PER_WORKER} trials -> {len(trials)} finished "
        f"trials, numbers 0..{len(trials) - 1} once each, references once, in {run.wall_s:.0f} s"
    )


@pytest.mark.process
def test_two_workers_on_a_journal_file_lose_and_duplicate_nothing(journal_two_workers):
    check_two_workers(journal_two_workers)


@pytest.mark.postgres
@pytest.mark.process
def test_two_workers_on_postgres_lose_and_duplicate_nothing(postgres_two_workers):
    check_two_workers(postgres_two_workers)
