"""Runs one trial in a fresh process, in its own process group, and decides its outcome.

Nothing a trial starts outlives it. At the timeout, after the trial ends whatever happened,
and on Ctrl-C (or SIGTERM / SIGHUP), the runner kills

  - the trial's process group (DataLoader workers and anything else that stays in it);
  - every descendant it has seen while polling (a PID scan by parent pid, every POLL_S), kept
    as (pid, start time) so a reused pid is never hit: this catches a child that moved to a
    session or group of its own (setsid), which a group kill misses;
  - every process whose environment carries this trial's token (TRIAL_TOKEN_ENV): a process
    inherits its parent's environment whatever session it moves to, so this catches what was
    started and orphaned between two polls (a double fork).

A cgroup would contain the tree by construction, but creating one needs a delegated cgroup v2
hierarchy that most machines do not give an unprivileged user; the PID scan works everywhere
Linux does. On CPU the runner also watches the tree's memory (`ProcessTreeMemory`): far past
the limit it stops the trial before the machine starts swapping, and records it
`over_memory_limit`."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from autotune.config import RunSpec, TrainConfig, check_runnable_here
from autotune.device import DeviceInfo, ProcessTreeMemory, descendants
from autotune.device.disk import FULL_DISK_ERRNOS, disk_full, disk_full_in
from autotune.device.memory import oom_kill_count, oom_killed_since, read_stat
from autotune.errors import DiskFull, UnsupportedConfig
from autotune.knobs.process import process_env
from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.trial import folders, fork_server
from autotune.trial.processes import (
    begin_stop,
    death_signal_setter,
    kill_group,
    kill_processes,
    processes_with_env,
    stderr_tail,
    stop_signals_recorded,
    stops_deferred,
)

POLL_S = 0.05
TRIAL_TOKEN_ENV = fork_server.TOKEN_ENV


@dataclass
class TrialResult:
    outcome: str
    reason: str | None
    measurement: Measurement | None = None  # when the trial process reported one
    wall_s: float = 0.0  # from spawning the process to its end
    phase_s: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_sec(self) -> float | None:
        return self.measurement.tokens_per_sec if self.measurement else None

    @property
    def peak_memory_bytes(self) -> int | None:
        return self.measurement.peak_memory_bytes if self.measurement else None


def run_trial(
    spec: RunSpec,
    cfg: TrainConfig,
    *,
    timeout_s: float,
    device: DeviceInfo | None = None,
    env: dict[str, str] | None = None,
    on_start=None,
) -> TrialResult:
    """Measure `cfg` in a child process. Never raises for what the trial does; a
    KeyboardInterrupt (Ctrl-C, or `Stopped` for SIGTERM/SIGHUP) kills the child's processes and
    propagates. A configuration this machine should not start (more DataLoader workers than
    it has CPUs for) is a UsageError, raised before any process starts. A disk with no room
    for the trial's files, or one its run crashed on, raises DiskFull (see `_raise_if_no_room`)."""
    check_runnable_here(cfg)
    request = {"spec": spec.to_dict(), "config": cfg.to_dict(), "device": device.to_dict() if device else None}
    limit = spec.memory_limit_bytes if spec.device_kind == "cpu" else None
    if spec.nproc_per_node > 1:
        # Several ranks (`trial.ranks`): refused before anything starts when they cannot run here (too
        # many workers for the CPUs, a parallelism of one process); on a CPU the tree holds N ranks.
        try:
            spec.accumulation_steps(cfg)
        except UnsupportedConfig as exc:
            return TrialResult(outcomes.UNSUPPORTED, str(exc))
        limit = limit * spec.nproc_per_node if limit else None
    # The process stage's variables (the allocator reads its settings once, when CUDA starts).
    env = {**(env or {}), **process_env(cfg, {**os.environ, **(env or {})})}
    child = run_child(["--measure"], request, timeout_s=timeout_s, env=env, on_start=on_start, rss_limit=limit)
    return trial_result(child)


def trial_result(child: "ChildRun") -> TrialResult:
    """How a measuring child (`--measure`, `--generate`) ended, as the trial's result."""
    if child.verdict is not None:
        return TrialResult(child.verdict[0], child.verdict[1], wall_s=child.wall_s)
    if child.payload is not None:
        m = Measurement.from_dict(child.payload["measurement"])
        _raise_if_crashed_for_want_of_room(m.outcome, m.reason)
        phases = dict(m.phase_s)
        phases["spawn_to_ready"] = child.payload["ready_at"] - child.spawned
        phases["teardown"] = max(0.0, child.wall_s - phases["spawn_to_ready"] - phases.get("total", 0.0))
        return TrialResult(m.outcome, m.reason, m, wall_s=child.wall_s, phase_s=phases)
    outcome, reason = outcomes.classify_exit(child.returncode, child.stderr_tail, oom_killed=child.oom_killed)
    return TrialResult(outcome, reason, wall_s=child.wall_s)


def run_soak(
    spec: RunSpec, cfg: TrainConfig, *, steps: int | None, timeout_s: float, device: DeviceInfo | None = None
) -> tuple[str, str | None, dict[str, Any] | None]:
    """A soak run (`measure.soak_loop`) in a child process, as `run_trial` runs a measurement:
    (outcome, reason, the SoakRun as a dict when it wrote one)."""
    check_runnable_here(cfg)
    request = {
        "spec": spec.to_dict(),
        "config": cfg.to_dict(),
        "device": device.to_dict() if device else None,
        "steps": steps,
    }
    limit = spec.memory_limit_bytes if spec.device_kind == "cpu" else None
    env = process_env(cfg, dict(os.environ))
    child = run_child(["--soak"], request, timeout_s=timeout_s, env=env, rss_limit=limit)
    if child.verdict is not None:
        return child.verdict[0], child.verdict[1], None
    if child.payload is not None:
        run = child.payload["soak"]
        _raise_if_crashed_for_want_of_room(run["outcome"], run.get("reason"))
        return run["outcome"], run.get("reason"), run
    return (*outcomes.classify_exit(child.returncode, child.stderr_tail, oom_killed=child.oom_killed), None)


@dataclass
class ChildRun:
    """How one child (`python -m autotune.trial MODE ...`) ended."""

    returncode: int
    payload: dict[str, Any] | None  # its result file, when it wrote one
    verdict: tuple[str, str] | None  # (outcome, reason) when the runner had to stop it
    stderr_tail: str
    spawned: float
    wall_s: float
    reaped: list[int] = field(default_factory=list)  # descendants killed after it ended
    oom_killed: bool | None = None  # the kernel's OOM killer killed a process meanwhile; None: unknown


def run_child(
    mode: list[str],
    request: dict[str, Any],
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    on_start: Callable[[int], None] | None = None,
    rss_limit: int | None = None,
) -> ChildRun:
    """Run `python -m autotune.trial MODE REQUEST RESULT PARENT_PID` (forked from the fork
    server, see `trial.fork_server`, or as a fresh interpreter) in its own session, with a timeout,
    and reap everything it started (see the module's docstring)."""
    fork = fork_server.fork_enabled()
    token = fork_server.token() if fork else secrets.token_hex(16)  # the tuner's, or this trial's
    with _room_needed(tempfile.gettempdir()):
        folder = tempfile.TemporaryDirectory(prefix=folders.folder_prefix())
    with folder as tmp:
        request_path, result, stderr_path = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "stderr")
        with _room_needed(tmp):
            request_path.write_text(json.dumps(request))
            stderr_path.touch()
        argv = [*mode, str(request_path), str(result)]
        spawned = time.time()
        kills_before = oom_kill_count()
        seen: dict[int, int] = {}  # descendants seen while it ran: pid -> start time
        proc = _start(argv, _child_env(env, token), stderr_path, fork, _model_of(request))
        seen[proc.pid] = _start_time(proc.pid) or 0  # the trial itself, killed by pid if its group is not yet made
        try:
            if on_start is not None:  # inside the try: a Ctrl-C here must still kill the group
                on_start(proc.pid)
            verdict = _wait(proc, timeout_s, rss_limit, seen)
        finally:
            # Not cut short by a second signal: a half-done clean-up leaves processes behind.
            with stops_deferred():
                reaped = _reap(proc, seen, token)
        wall = time.time() - spawned
        payload = json.loads(result.read_text()) if verdict is None and result.exists() else None
        oom_killed = oom_killed_since(kills_before)
        tail = stderr_tail(stderr_path)
        if verdict is None and payload is None:
            _raise_if_no_room(proc.returncode, tail, tmp)
        return ChildRun(proc.returncode, payload, verdict, tail, spawned, wall, reaped, oom_killed)


@contextlib.contextmanager
def _room_needed(where: str) -> Iterator[None]:
    """A write inside the block refused for want of room raises DiskFull, naming the file (else
    `where`); other errors go on as they are."""
    try:
        yield
    except OSError as exc:
        full = disk_full(exc, where)
        if full is None:
            raise
        raise full from None


def _raise_if_no_room(returncode: int, tail: str, folder: str) -> None:
    """A child that ended without a result for want of room: it exits with the error's number
    when it cannot write its result (see trial.__main__), or its stderr says so. A full disk is
    no fault of the configuration, and every child after it would fail the same way: DiskFull,
    naming the path (else the child's folder), stops the caller instead of a crash recorded."""
    full = disk_full_in(tail, folder)
    if full is None and returncode in FULL_DISK_ERRNOS:
        full = DiskFull(folder, os.strerror(returncode))
    if full is not None:
        raise full


def _raise_if_crashed_for_want_of_room(outcome: str, reason: str | None) -> None:
    """The same for a run that recorded a crash whose error says the disk had no room (a file of
    the model's, torch.compile's cache in the temporary folder)."""
    full = disk_full_in(reason) if outcome == outcomes.CRASHED and reason else None
    if full is not None:
        raise full


def _model_of(request: dict[str, Any]) -> str | None:
    """The model a child builds: a probe's request names it, a measurement's spec does."""
    return request.get("model") or (request.get("spec") or {}).get("model")


def _start(
    argv: list[str], env: dict[str, str], output: Path, fork: bool, model: str | None
) -> fork_server.TrialProcess | subprocess.Popen:
    if fork:
        try:
            return fork_server.TrialProcess(
                argv, env=env, cwd=os.getcwd(), output=str(output), preload=fork_server.preload_for(model)
            )
        except OSError as exc:  # no server here: the trial still runs, in a fresh interpreter
            fork_server.disable(str(exc))
    with open(output, "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "autotune.trial", *argv, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
            start_new_session=True,  # its own process group, killed whole
            # Dies with the tuner from its first instruction: the trial's own die_with_parent
            # comes only after the interpreter has started and imported (a second or so).
            preexec_fn=death_signal_setter(os.getpid()),
            env=env,
            cwd=os.getcwd(),
        )


def _wait(
    proc: subprocess.Popen, timeout_s: float, rss_limit: int | None, seen: dict[int, int]
) -> tuple[str, str] | None:
    """Wait for the process, noting its descendants; return (outcome, reason) if the runner had
    to stop it."""
    deadline = time.monotonic() + timeout_s
    # A slower PSS refresh than the trial's own sampler: this is a safety stop, not the figure.
    memory = ProcessTreeMemory(proc.pid, pss_refresh_s=2.0) if rss_limit else None
    # A stop signal is raised here, between polls, never inside Popen.poll(): landing between
    # its taking and releasing its wait lock would leave the lock taken, and _reap's wait() hung.
    with stop_signals_recorded() as received:
        while not received and proc.poll() is None:
            _note_descendants(proc.pid, seen)
            if time.monotonic() > deadline:
                return outcomes.timed_out(timeout_s)
            if memory is not None:
                verdict = outcomes.stopped_over_memory(memory.sample(), rss_limit)
                if verdict is not None:
                    return verdict
            time.sleep(POLL_S)
    if received:
        begin_stop(received[0])  # raises: no signal is recorded while a stop is under way
    return None


def _note_descendants(pid: int, seen: dict[int, int]) -> None:
    for child in descendants(pid):
        if child not in seen:
            stat = read_stat(child)
            if stat is not None:
                seen[child] = stat.start_time


def _reap(proc: fork_server.TrialProcess | subprocess.Popen, seen: dict[int, int], token: str) -> list[int]:
    """Kill the child and everything it started, then wait for the child."""
    _note_descendants(proc.pid, seen)  # whatever started since the last poll, while it is alive
    kill_group(proc.pid)  # workers and anything else that stayed in the trial's group
    if proc.poll() is None:  # a forked trial may not have made its session yet
        kill_processes([(proc.pid, seen[proc.pid])])
    proc.wait()
    reaped = kill_processes((pid, start) for pid, start in seen.items() if pid != proc.pid)
    # Every carrier of the token but this tuner's own children (the fork server and
    # multiprocessing's resource tracker carry it; a trial's leftovers never are our children).
    own = os.getpid()
    carriers = [(pid, start) for pid, start in processes_with_env(TRIAL_TOKEN_ENV, token) if _parent(pid) != own]
    reaped += kill_processes(carriers)
    return sorted(set(reaped))


def _start_time(pid: int) -> int | None:
    stat = read_stat(pid)
    return stat.start_time if stat is not None else None


def _parent(pid: int) -> int | None:
    stat = read_stat(pid)
    return stat.ppid if stat is not None else None


def _child_env(extra: dict[str, str] | None, token: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # NVML's order: indices then agree
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    env[TRIAL_TOKEN_ENV] = token  # marks every process the trial starts, see _reap
    return env
