"""`autotune search --devices 0,1,2,3`: one worker per GPU of this host, all feeding one study.

Each worker is a child `autotune search` pinned to its GPU by UUID (CUDA_VISIBLE_DEVICES=<uuid>
and --device cuda:0): the worker, and the trials it starts, see that GPU and no other,
whatever CUDA's device order. The parent

  - validates everything and creates the study (reference trials enqueued once) before any
    worker starts, so bad input fails once, here, with nothing started;
  - splits --n-trials evenly (it is the total across workers);
  - prints each worker's lines prefixed with its GPU;
  - forwards Ctrl-C: every worker stops its running trial, records it as interrupted and
    exits 130 (a second Ctrl-C kills them; their trials are then failed at the next run);
  - prints the summary of the whole study and writes its best recipe.

The storage URL reaches the workers through the environment (AUTOTUNE_STORAGE), never their
command line, where `ps` would show a password to every user of the host. Workers die with
the parent (PR_SET_PDEATHSIG delivers SIGINT: they record their trial and stop)."""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import IO, Sequence

from autotune import environment
from autotune.errors import UsageError
from autotune.search.settings import worker_argv
from autotune.trial.processes import death_signal_setter, stop_signals_recorded

log = logging.getLogger(__name__)

STORAGE_ENV = environment.STORAGE


@dataclass(frozen=True)
class WorkerDevice:
    index: int  # among this host's visible GPUs (nvidia-smi's order unless CUDA_VISIBLE_DEVICES says otherwise)
    pin: str  # the worker's CUDA_VISIBLE_DEVICES: the GPU's UUID, or the index when NVML is missing

    @property
    def tag(self) -> str:
        return f"gpu{self.index}"


@dataclass(frozen=True)
class WorkerPlan:
    device: WorkerDevice
    n_trials: int | None
    command: list[str]
    env: dict[str, str]  # set on top of the parent's environment


# --- planning (pure) --------------------------------------------------------------------------


def parse_devices(text: str) -> list[str]:
    """ "0,1,2,3" or "GPU-8c1a...,GPU-77f0..." -> the entries, checked for form and repeats."""
    entries = [e.strip() for e in str(text).split(",")]
    if not entries or any(not e for e in entries):
        raise UsageError(f"--devices: expected GPU indices or UUIDs separated by commas, e.g. 0,1,2,3; got {text!r}")
    for entry in entries:
        if entry.startswith("MIG-"):
            # A worker's trials would need CUDA_VISIBLE_DEVICES=<its instance> while the
            # parent describes the device; MIG instances are run as separate searches instead.
            raise UsageError(
                f"--devices: {entry} is a MIG instance; --devices pins whole GPUs. Run one search per instance "
                "on a shared storage: CUDA_VISIBLE_DEVICES=MIG-... autotune search --storage journal:PATH --study NAME"
            )
        if not (entry.isdigit() or entry.startswith("GPU-")):
            raise UsageError(f"--devices: {entry!r} is neither a GPU index (0, 1, ...) nor a UUID (GPU-...)")
    repeated = sorted({e for e in entries if entries.count(e) > 1})
    if repeated:
        raise UsageError(f"--devices: {', '.join(repeated)} given more than once (one worker per GPU)")
    return entries


def resolve_devices(entries: Sequence[str], uuids: Sequence[str] | None) -> list[WorkerDevice]:
    """Pin each entry to a GPU. `uuids`: the visible GPUs' UUIDs from NVML, in index order;
    None without NVML, when only indices can be used (pinned as given, in PCI bus order)."""
    devices: list[WorkerDevice] = []
    for entry in entries:
        if uuids is None:
            if not entry.isdigit():
                raise UsageError(
                    f"--devices: {entry} is a UUID, and without NVML UUIDs cannot be matched to GPUs: give indices"
                )
            devices.append(WorkerDevice(int(entry), entry))
        elif entry.isdigit():
            index = int(entry)
            if index >= len(uuids):
                have = f"{len(uuids)} ({', '.join(map(str, range(len(uuids))))})" if uuids else "none"
                raise UsageError(f"--devices: GPU {index} does not exist; the GPUs here are {have}")
            devices.append(WorkerDevice(index, uuids[index]))
        else:
            matches = [i for i, u in enumerate(uuids) if u.startswith(entry)]
            if len(matches) != 1:
                raise UsageError(f"--devices: {entry} matches {len(matches)} of this host's GPUs; expected exactly one")
            devices.append(WorkerDevice(matches[0], uuids[matches[0]]))
    pins = [d.pin for d in devices]
    if len(set(pins)) != len(pins):
        raise UsageError("--devices: the same GPU is given twice (once by index, once by UUID)")
    return devices


def split_trials(total: int | None, workers: int) -> list[int | None]:
    """--n-trials is the total: 10 over 4 workers -> [3, 3, 2, 2]; no cap (None) for each when
    there is none (--until-converged: every worker stops when the shared study has converged)."""
    if total is None:
        return [None] * workers
    return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


def worker_command(
    settings,
    *,
    study: str,
    memory_limit_bytes: int,
    trial_timeout_s: float,
    n_trials: int | None,
    verbose: bool = False,
    as_json: bool = False,
) -> list[str]:
    """The child `autotune search` of one worker. Everything that makes trials comparable is
    resolved by the parent and passed explicitly (study name, memory limit in bytes, trial
    timeout), so no worker can differ from the others by computing a default on its own.
    The storage URL is not here: it goes in the environment (see worker_env)."""
    cmd = [sys.executable, "-m", "autotune"] + (["-v"] if verbose else []) + ["search", "--worker"]
    # What the parent resolved for all workers alike, then every setting the parent was given.
    cmd += ["--device", "cuda:0", "--study", study, "--memory-limit", str(memory_limit_bytes)]
    cmd += ["--trial-timeout", f"{trial_timeout_s:g}s"]
    if n_trials is not None:
        cmd += ["--n-trials", str(n_trials)]
    cmd += worker_argv(settings)
    if as_json:
        cmd.append("--json")  # quiet workers: the parent's stdout is one JSON document
    return cmd


def worker_env(device: WorkerDevice, storage_url: str) -> dict[str, str]:
    return {
        "CUDA_VISIBLE_DEVICES": device.pin,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # only matters when pinned by index: nvidia-smi's order
        STORAGE_ENV: storage_url,
        "PYTHONUNBUFFERED": "1",  # lines reach the parent as they are written
    }


def plan_workers(
    settings,
    devices: Sequence[WorkerDevice],
    *,
    study: str,
    storage_url: str,
    memory_limit_bytes: int,
    trial_timeout_s: float,
    verbose: bool = False,
    as_json: bool = False,
) -> list[WorkerPlan]:
    """One plan per device that gets at least one trial."""
    plans = []
    for device, n in zip(devices, split_trials(settings.trial_cap, len(devices))):
        if n == 0:  # more workers than trials (None: no cap, every worker runs)
            continue
        cmd = worker_command(
            settings,
            study=study,
            memory_limit_bytes=memory_limit_bytes,
            trial_timeout_s=trial_timeout_s,
            n_trials=n,
            verbose=verbose,
            as_json=as_json,
        )
        plans.append(WorkerPlan(device, n, cmd, worker_env(device, storage_url)))
    return plans


# --- running ----------------------------------------------------------------------------------


def run_workers(settings, devices_text: str, *, as_json: bool = False):
    """Validate, create the study, run one worker per device, and return the SearchResult of
    the whole study; raise SearchInterrupted (exit 130) after a Ctrl-C."""
    from autotune.device import visible_gpu_uuids
    from autotune.recipe.from_study import write_recipe
    from autotune.search.run import SQLITE_WORKERS_WARNING, SearchInterrupted, SearchResult, open_search
    from autotune.study.summary import summarize
    from autotune.study.urls import is_sqlite, parse_storage_url, redact

    if settings.device not in ("auto", "cuda"):
        raise UsageError(
            f"--devices starts one worker per GPU, each on its own device: drop --device {settings.device}"
        )
    if settings.storage and parse_storage_url(settings.storage).in_memory:
        raise UsageError("--devices: an in-memory storage cannot be shared by workers; use journal:PATH")
    entries = parse_devices(devices_text)
    uuids = visible_gpu_uuids()
    if uuids is None:
        log.warning(
            "NVML is unavailable: workers are pinned by index (CUDA_VISIBLE_DEVICES=<index>, in PCI bus "
            "order), not by UUID"
        )
    devices = resolve_devices(entries, uuids)
    # Validates everything, creates or resumes the study (reference trials and warm start
    # enqueued once) and fails a dead tuner's trials once, here, rather than racing in every worker.
    opened = open_search(replace(settings, device=f"cuda:{devices[0].index}"))
    study, ctx, name, url, is_new = opened.study, opened.task, opened.name, opened.url, opened.is_new
    if len(devices) > 1 and is_sqlite(url):
        log.warning("%d workers on %s. %s", len(devices), redact(url), SQLITE_WORKERS_WARNING)
    plans = plan_workers(
        settings,
        devices,
        study=name,
        storage_url=url,
        memory_limit_bytes=ctx.memory_limit_bytes,
        trial_timeout_s=ctx.trial_timeout_s,
        verbose=log.isEnabledFor(logging.INFO),
        as_json=as_json,
    )
    before = len(study.trials)
    codes, interrupted = supervise(plans)
    summary = summarize(study)
    recipe_path = write_recipe(study, summary, name, url, settings.recipe) if summary.best is not None else None
    failures = [
        f"worker {p.device.tag} ({p.device.pin}) exited with status {code}"
        for p, code in zip(plans, codes)
        if code not in (0, 129, 130, 143)
    ]
    stopped = fleet_stop(settings, study, ctx, ran=len(summary.trials) - before, interrupted=interrupted)
    result = SearchResult(study, summary, ctx, url, recipe_path, is_new, worker_failures=failures, stopped=stopped)
    if interrupted:
        raise SearchInterrupted(result)
    return result


def fleet_stop(settings, study, ctx, *, ran: int, interrupted: bool):
    """Why the workers stopped, as one search: each decided for itself, on the shared study; the
    planner says whether the study has settled."""
    from autotune.search.sampler import study_sampler
    from autotune.search.stopping import budget_stop, interrupted_stop, settled_stop

    if interrupted:
        return interrupted_stop("SIGINT")
    why = study_sampler(ctx).stop_reason(study)
    if why is not None:
        return settled_stop(why)
    return budget_stop(
        ran=ran, n_trials=settings.trial_cap, timeout_s=settings.timeout_s, cap=settings.n_trials is None
    )


def supervise(
    plans: Sequence[WorkerPlan], out: IO[str] | None = None, err: IO[str] | None = None, poll_s: float = 0.2
) -> tuple[list[int], bool]:
    """Start every worker, relay its lines with its tag, wait for all of them. Ctrl-C (or
    SIGTERM / SIGHUP): SIGINT to each worker (they stop and record their trial); a second one:
    SIGKILL. Returns (exit codes in plan order, whether it was stopped)."""
    out, err = out or sys.stdout, err or sys.stderr
    procs: list[subprocess.Popen] = []
    try:
        for plan in plans:
            log.info(
                "worker %s: CUDA_VISIBLE_DEVICES=%s %s", plan.device.tag, plan.device.pin, shlex.join(plan.command)
            )
            procs.append(_spawn(plan))
    except BaseException:
        for proc in procs:
            _signal(proc, signal.SIGKILL)
        raise
    lock = threading.Lock()
    pumps = [
        threading.Thread(target=_relay, args=(stream, f"[{plan.device.tag}] ", sink, lock), daemon=True)
        for plan, proc in zip(plans, procs)
        for stream, sink in ((proc.stdout, out), (proc.stderr, err))
    ]
    for pump in pumps:
        pump.start()
    handled = 0
    with stop_signals_recorded() as received:  # never raised mid-poll: see stop_signals_recorded
        while any(proc.poll() is None for proc in procs):
            if len(received) > handled:
                handled = len(received)
                if handled == 1:
                    log.warning(
                        "stopping: each worker records its running trial as interrupted (Ctrl-C again to kill them)"
                    )
                for proc in procs:
                    _signal(proc, signal.SIGINT if handled == 1 else signal.SIGKILL)
            time.sleep(poll_s)
    for pump in pumps:
        pump.join(timeout=5)
    return [proc.returncode for proc in procs], handled > 0


def _spawn(plan: WorkerPlan) -> subprocess.Popen:
    # SIGINT, not SIGKILL, when the parent dies: the worker records its trial and stops.
    return subprocess.Popen(
        plan.command,
        env={**os.environ, **plan.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a terminal's Ctrl-C reaches the parent only; it forwards
        preexec_fn=death_signal_setter(os.getpid(), signal.SIGINT),
    )


def _signal(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def _relay(stream: IO[bytes], prefix: str, sink: IO[str], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        with lock:
            sink.write(prefix + line + "\n")
            sink.flush()
    stream.close()
