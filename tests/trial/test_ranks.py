"""A trial of several ranks (`trial.ranks`): one launch of N processes through torch's elastic
launcher, each rank measuring with the one loop, the launcher aggregating. A rank that raises
fails the trial with its reason, a hanging rank times out, and kill -9 of the tuner: in each,
no rank is left behind and the rendezvous port is free again."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.config import RunSpec, TrainConfig, usable_cpus
from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.trial.ranks import aggregate, failed_rank
from autotune.trial.runner import run_trial
from tests.attack_helpers import in_repo_env
from tests.fault_env import RANKS_DIR_ENV
from tests.helpers import repo_env, timeout_passes_once
from tests.listening import listening_addresses, socket_inodes

DDP = TrainConfig(parallelism="ddp", token_budget=512, batching="packed")


def spec(model: str = "gpt2-tiny", **extra) -> RunSpec:
    return RunSpec(model=model, device="cpu", warmup=1, steps=4, min_time_s=0, nproc_per_node=2, **extra)


def _rank(k: int, tokens: int, window_s: float, peak: int, wait: float, *, outcome: str = "ok") -> dict:
    m = Measurement(
        config=DDP.to_dict(),
        outcome=outcome,
        tokens_per_sec=tokens / window_s,
        padded_tokens_per_sec=tokens / window_s,
        peak_memory_bytes=peak,
        data_wait_fraction=wait,
        mfu=0.1,
        world_size=2,
        ranks=[
            {
                "rank": k,
                "tokens": tokens,
                "positions": tokens,
                "window_s": window_s,
                "tokens_per_sec": tokens / window_s,
                "data_wait_fraction": wait,
                "peak_memory_bytes": peak,
            }
        ],
    )
    return {"rank": k, "measurement": m.to_dict(), "ready_s": 1.0 + k, "rendezvous_s": 0.5}


def test_the_aggregate_is_every_ranks_tokens_over_the_slowest_window():
    m = aggregate([_rank(0, 1000, 1.0, 300, 0.01), _rank(1, 900, 1.25, 400, 0.05)])
    assert m.tokens_per_sec == pytest.approx(1900 / 1.25)
    assert m.per_device_tokens_per_sec == pytest.approx(1900 / 1.25 / 2)
    assert m.straggler_ratio == pytest.approx(1.25)
    assert m.peak_memory_bytes == 400  # the worst rank's: the limit is per device
    assert m.data_wait_fraction == pytest.approx(0.05)
    assert [r["data_wait_fraction"] for r in m.ranks] == [0.01, 0.05]
    # MFU per device, linear in throughput: the slowest rank's 0.1 at 720 tokens/s, scaled to 760
    assert m.mfu == pytest.approx(0.1 * (1900 / 1.25 / 2) / 720)
    assert m.world_size == 2 and m.phase_s["rank_start"] == 2.0
    assert "ranks" in m.to_dict() and "ranks" not in Measurement(config={}, outcome="ok").to_dict()


def test_the_failing_rank_is_the_cause_not_the_connections_it_broke():
    broken = _rank(0, 1, 1.0, 1, 0.0)
    broken["measurement"] = Measurement.failed(
        DDP.to_dict(), outcomes.CRASHED, "RuntimeError: [gloo] Connection closed by peer"
    ).to_dict()
    broken["failed_at"] = 2.0
    cause = _rank(1, 1, 1.0, 1, 0.0)
    cause["measurement"] = Measurement.failed(DDP.to_dict(), outcomes.OOM, "out of memory").to_dict()
    cause["failed_at"] = 3.0  # later, but its own failure
    assert failed_rank({0: broken, 1: cause}, {}, 2) == (outcomes.OOM, "rank 1 of 2: out of memory")
    # a rank stopped by the launcher (SIGTERM, earlier) is not the cause of the rank that raised
    stopped = {0: {"exitcode": -15, "timestamp": 1, "message": "Signal 15 (SIGTERM) received", "stderr_tail": ""}}
    assert failed_rank({1: cause}, stopped, 2) == (outcomes.OOM, "rank 1 of 2: out of memory")
    # a rank that ended without a result: the launcher's word (its signal)
    died = {1: {"exitcode": -9, "timestamp": 1.0, "message": "Signal 9 (SIGKILL) received", "stderr_tail": ""}}
    outcome, reason = failed_rank({0: broken}, died, 2)
    assert reason.startswith("rank 1 of 2: ") and outcome != outcomes.OK
    assert failed_rank({0: _rank(0, 1, 1.0, 1, 0.0)}, {}, 2) == (
        outcomes.CRASHED,
        "rank 1 of 2 ended without writing its figures",
    )


@pytest.mark.parametrize("oom_kills, expected", [((5, 5), outcomes.KILLED), ((5, 6), outcomes.OOM)])
def test_a_rank_killed_from_outside_is_killed_not_out_of_memory(tmp_path, monkeypatch, oom_kills, expected):
    """Issue D, M02: a rank SIGKILLed by another process was recorded `oom` ("most likely the
    kernel's OOM killer") and taught the memory model a false "at least the limit", where a trial of
    one process says `killed`. A launch decides as the runner does: the launcher's record of the
    rank (exit code -9) and the kernel's OOM-kill count around the launch, read by the one rule
    (`outcomes.classify_exit`); with an OOM kill counted meanwhile it is `oom`."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from torch.distributed.launcher import api

    from autotune.device import memory
    from autotune.trial.ranks import launch

    counts = iter(oom_kills)
    monkeypatch.setattr(memory, "oom_kill_count", lambda *args: next(counts))
    nowhere = str(tmp_path / "no-error-file.json")

    def one_rank_killed(config, entrypoint):  # the agent's record: rank 1 killed, rank 0 stopped after it
        def run(*args):
            stopped, killed = ProcessFailure(0, 4320, -signal.SIGTERM, nowhere), ProcessFailure(1, 4321, -9, nowhere)
            killed.timestamp, stopped.timestamp = 1, 2
            raise ChildFailedError("autotune.trial", {0: stopped, 1: killed})

        return run

    monkeypatch.setattr(api, "elastic_launch", one_rank_killed)
    for name in ("OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME"):  # what the launch sets, put back after
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    request = {"spec": spec().to_dict(), "config": DDP.to_dict()}
    m = launch(request, str(tmp_path / "request.json"), str(tmp_path / "result.json"))
    assert m.outcome == expected, m.reason
    assert m.reason.startswith("rank 1 of 2: killed by SIGKILL")
    assert ("from outside" in m.reason) == (expected == outcomes.KILLED)
    assert next(counts, None) is None  # counted before the launch and after it


def test_too_many_workers_per_rank_are_refused_before_anything_starts():
    workers = usable_cpus()  # 2 x (workers + 1) processes > the CPUs
    result = run_trial(spec(), DDP.replace(num_workers=workers), timeout_s=60)
    assert result.outcome == outcomes.UNSUPPORTED and "would oversubscribe" in result.reason
    assert result.wall_s == 0.0  # nothing was started


def _port_free(port: int, seconds: float = 5.0) -> bool | str:
    """Whether the store's port can be bound again: True, or what still holds it (`ss`). Polled:
    a dead process's sockets are closed by the kernel after it is reaped, not with it."""
    deadline = time.monotonic() + seconds
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                return True
            except OSError:
                pass
        if time.monotonic() > deadline:
            held = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, check=False).stdout
            return "\n".join(line for line in held.splitlines() if f":{port} " in line) or f"port {port} held"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _ranks_noted(folder: Path) -> list[tuple[int, int]]:
    """(pid, port) of each rank that noted itself (tests.fault_models)."""
    noted = []
    for path in sorted(folder.glob("rank-*.pid")):
        pid, port = path.read_text().split()
        noted.append((int(pid), int(port)))
    return noted


def _gone(noted: list[tuple[int, int]], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid, _ in noted) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_alive(pid) for pid, _ in noted)


@pytest.mark.process
def test_a_two_rank_ddp_trial_measures_each_rank_and_aggregates():
    result = run_trial(spec(), DDP, timeout_s=300)
    assert result.outcome == outcomes.OK, result.reason
    m = result.measurement
    assert m.world_size == 2 and [r["rank"] for r in m.ranks] == [0, 1]
    windows = [r["window_s"] for r in m.ranks]
    assert m.tokens_per_sec == pytest.approx(sum(r["tokens"] for r in m.ranks) / max(windows))
    assert m.per_device_tokens_per_sec == pytest.approx(m.tokens_per_sec / 2)
    assert m.straggler_ratio == pytest.approx(max(windows) / min(windows)) and m.straggler_ratio >= 1.0
    assert m.peak_memory_bytes == max(r["peak_memory_bytes"] for r in m.ranks)
    assert all(r["threads"] == max(1, usable_cpus() // 2) for r in m.ranks)  # OMP_NUM_THREADS per rank
    # what a rank costs to start: launch to its entry, its imports, its rendezvous
    assert all(m.phase_s[k] > 0 for k in ("rank_start", "rank_imports", "rank_rendezvous", "launch"))
    # the same optimizer steps on each rank (they stop together), whole ones
    assert m.steps % m.accumulation_steps == 0


@pytest.mark.process
def test_a_rank_that_raises_fails_the_trial_with_its_reason_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(RANKS_DIR_ENV, str(tmp_path))
    in_repo_env(monkeypatch)
    result = run_trial(spec("tests.fault_models:rank_1_raises"), DDP, timeout_s=300)
    assert result.outcome == outcomes.CRASHED, result.reason
    assert result.reason.startswith("rank 1 of 2: ") and "boom on rank 1" in result.reason
    noted = _ranks_noted(tmp_path)
    assert len(noted) == 2 and _gone(noted, 5), noted
    assert (held := _port_free(noted[0][1])) is True, held


@pytest.mark.process
def test_a_hanging_rank_times_out_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(RANKS_DIR_ENV, str(tmp_path))
    in_repo_env(monkeypatch)
    timeout_passes_once(monkeypatch, lambda: len(list(tmp_path.glob("rank-*.pid"))) == 2)
    result = run_trial(spec("tests.fault_models:rank_1_hangs"), DDP, timeout_s=300)
    assert result.outcome == outcomes.TIMEOUT, result.reason
    noted = _ranks_noted(tmp_path)
    assert len(noted) == 2 and _gone(noted, 5), noted
    assert (held := _port_free(noted[0][1])) is True, held


TUNER = """
import sys
from autotune.config import RunSpec, TrainConfig
from autotune.trial.runner import run_trial
spec = RunSpec(model="tests.fault_models:rank_1_hangs", device="cpu", warmup=1, steps=4, min_time_s=0, nproc_per_node=2)
run_trial(spec, TrainConfig(parallelism="ddp", token_budget=512, batching="packed"), timeout_s=600)
"""


@pytest.mark.process
def test_kill_9_of_the_tuner_leaves_no_rank(tmp_path):
    env = repo_env(**{RANKS_DIR_ENV: str(tmp_path)})
    tuner = subprocess.Popen([sys.executable, "-c", TUNER], cwd=os.getcwd(), env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while len(_ranks_noted(tmp_path)) < 2 and time.monotonic() < deadline and tuner.poll() is None:
            time.sleep(0.2)
        noted = _ranks_noted(tmp_path)
        assert len(noted) == 2, tuner.stderr.read().decode()[-2000:] if tuner.poll() is not None else noted
        time.sleep(1.0)  # rank 1 in its endless forward, rank 0 waiting on it
        tuner.kill()
        tuner.wait()
        assert _gone(noted, 10), [pid for pid, _ in noted if _alive(pid)]
        assert (held := _port_free(noted[0][1])) is True, held
    finally:
        if tuner.poll() is None:
            tuner.kill()
        for pid, _ in _ranks_noted(tmp_path):
            if _alive(pid):
                os.kill(pid, 9)


@pytest.mark.slow
def test_the_rendezvous_of_a_launch_listens_on_loopback_only(tmp_path):
    """Issue D, M09: the launch's stores (the rendezvous's, and the one MASTER_ADDR:MASTER_PORT
    names for the ranks) listened on every interface: anyone on the network could write the
    rendezvous. The launch's own rendezvous handler, joined here as a node of one (no process
    started), must listen on 127.0.0.1 alone and send the ranks there."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

    from autotune.trial.ranks import launch_config

    config = launch_config(2, tmp_path)
    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    before = socket_inodes(os.getpid())
    handler = rendezvous_handler_registry.create_handler(params)
    try:
        info = handler.next_rendezvous()
        opened = listening_addresses(socket_inodes(os.getpid()) - before)
        store_port = info.store.underlying_store.port
        bootstrap = info.bootstrap_store_info
        assert store_port in opened and bootstrap.master_port in opened
        assert opened == {port: {"127.0.0.1"} for port in opened}, opened
        assert bootstrap.master_addr == "127.0.0.1"  # not the host's name: the ranks connect on loopback
    finally:
        handler.shutdown()


_SOCKETS_OF_A_RANK = """
import json, os, sys
import torch.distributed as dist
from tests.listening import listening_addresses, socket_inodes

dist.init_process_group("gloo")
dist.barrier()  # every store and every gloo connection made
seen = listening_addresses(socket_inodes(os.getppid(), os.getpid()))  # the launcher's and this rank's
out = {"sockets": {port: sorted(a) for port, a in seen.items()}, "master": os.environ["MASTER_ADDR"]}
open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w").write(json.dumps(out))
dist.barrier()
dist.destroy_process_group()
"""

_LAUNCH = """
import sys
from torch.distributed.launcher.api import elastic_launch
from autotune.trial.ranks import launch_config, set_rank_environment

set_rank_environment(2)
elastic_launch(launch_config(2, __import__("pathlib").Path(sys.argv[1])), sys.executable)(sys.argv[2], sys.argv[1])
"""


@pytest.mark.process
def test_a_two_rank_launch_listens_on_loopback_only(tmp_path):
    """Issue D, M09, for real: two gloo ranks launched as a trial launches them; while they are
    joined, every socket the launcher and the ranks listen on is on 127.0.0.1."""
    worker = tmp_path / "rank.py"
    worker.write_text(_SOCKETS_OF_A_RANK)
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCH, str(tmp_path), str(worker)],
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"{rank}.json").read_text())
        assert seen["master"] == "127.0.0.1"
        assert len(seen["sockets"]) >= 3, seen  # the two stores, and gloo's
        assert all(addresses == ["127.0.0.1"] for addresses in seen["sockets"].values()), seen
