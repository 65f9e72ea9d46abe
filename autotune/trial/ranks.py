"""A trial of several ranks: one launch of N processes on this host through PyTorch's own
launcher (`torch.distributed.launcher.api.elastic_launch`, what `torchrun --standalone` runs).

    tuner ── runner ── trial process (`--measure`, N > 1): the launcher, elastic's agent
                          ├── rank 0  (`python -m autotune.trial --rank ...`)
                          ├── ...
                          └── rank N-1

The trial process is the one the runner starts (forked from the fork server, or a fresh
interpreter); it runs the launcher, whose agent starts each rank as a fresh interpreter. What
the runner does for any trial covers them: each rank carries the trial's token in its
environment (elastic passes the agent's environment on), and the runner's reaping kills every
carrier, and every descendant it saw, at the timeout, after the trial and on a stop. Elastic puts
each rank in a session of its own (so a group kill alone would miss them); each rank also dies
with the trial process (PR_SET_PDEATHSIG), so kill -9 of the tuner takes the trial process
(its own death signal), and with it every rank, within a moment.

Each launch rendezvouses on a port of its own, the kernel's choice (as torchrun --standalone
does), held by the agent's store, freed when the trial process ends. Every store of the launch
listens on 127.0.0.1 only (`loopback_store`): torch's TCPStore listens on every interface
whatever host it is given, and anyone who reached it could join or corrupt the rendezvous; the
ranks are told MASTER_ADDR=127.0.0.1, and gloo's own sockets are on the loopback device. The backend
is gloo on CPU, nccl on CUDA (rank k on cuda:k). `OMP_NUM_THREADS` is the host's CPUs // N for
each rank, and a configuration whose N x (workers + 1) processes would oversubscribe the CPUs is
refused before anything starts (`config.check_ranks_fit`).

Each rank runs the one measuring loop (`measure.loop`, the ranks deciding their step counts
together: `measure.ranks`) and writes its figures to rank-K.json; this process aggregates them
(`aggregate`): global tokens/s = every rank's real tokens over the slowest rank's window, per
device tokens/s and MFU, the straggler ratio (slowest window over fastest), the worst rank's peak
memory (the limit is per device) and each rank's data wait. A rank that fails exits non-zero
after writing why; the agent then stops the others, and the trial fails with the first failing
rank's reason ("rank 1 of 2: ..."), not with the broken connections it left the others."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from autotune.measure import outcomes
from autotune.measure.measurement import Measurement

if TYPE_CHECKING:  # torch is imported when a launch starts
    from torch.distributed import TCPStore
    from torch.distributed.launcher.api import LaunchConfig

RANK_FILE = "rank-{}.json"
LOOPBACK = "127.0.0.1"
RENDEZVOUS = "autotune-loopback"  # the launch's rendezvous backend (`_loopback_rendezvous`)
# A connection a failed rank left behind: the others' errors, never the cause.
_COMMUNICATION_WORDS = ("connection closed", "connection reset", "broken pipe", "gloo", "nccl", "peer", "socket")


def launch(request: Mapping[str, Any], request_path: str, result_path: str) -> Measurement:
    """Run the request's measurement as one launch of `spec.nproc_per_node` ranks and return
    the aggregate (or the failing rank's outcome)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from autotune.config import RunSpec, TrainConfig
    from autotune.device.memory import oom_kill_count, oom_killed_since

    spec, cfg = RunSpec.from_dict(request["spec"]), TrainConfig.from_dict(request["config"])
    n = spec.nproc_per_node
    folder = Path(result_path).parent / "ranks"
    folder.mkdir(exist_ok=True)
    set_rank_environment(n)
    config = launch_config(n, folder)
    launched = time.time()
    kills_before = oom_kill_count()  # a rank's SIGKILL is the OOM killer's only if it counted one meanwhile
    failure = None
    try:
        elastic_launch(config, sys.executable)(
            "-m", "autotune.trial", "--rank", request_path, str(folder), str(os.getpid()), str(launched)
        )
    except ChildFailedError as exc:
        failure = exc
    returned = time.time()
    results = read_rank_results(folder, n)
    cause = failed_rank(results, _launcher_failures(failure, folder), n, oom_killed=oom_killed_since(kills_before))
    if cause is not None:
        return Measurement.failed(cfg.to_dict(), cause[0], cause[1], world_size=n)
    result = aggregate([results[k] for k in range(n)])
    # the launch's own time: what N ranks cost beyond the measurement
    ended = [results[k].get("finished_at") for k in range(n) if results[k].get("finished_at")]
    result.phase_s["rank_total"] = result.phase_s.get("total", 0.0)
    result.phase_s["launch"] = returned - launched  # the launcher's call, first rank spawned to the last reaped
    if ended:
        result.phase_s["launcher_exit"] = max(0.0, returned - max(ended))  # the last rank's result to the call's return
    return result


def set_rank_environment(n: int) -> None:
    """This process's environment, which the launcher passes on to each of `n` ranks."""
    from autotune.config import usable_cpus

    os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cpus() // n))  # each rank's share of the host
    # gloo's sockets on the loopback device, not on the interface the host's name resolves to;
    # a setting of the user's own is kept.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def launch_config(n: int, folder: Path) -> "LaunchConfig":
    """The launch of `n` ranks on this host, their logs under `folder`/logs, its rendezvous on
    loopback only (`_loopback_rendezvous`)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    _register_loopback_rendezvous()
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=n,
        run_id=f"autotune-{uuid.uuid4().hex[:12]}",
        rdzv_backend=RENDEZVOUS,
        rdzv_endpoint=f"{LOOPBACK}:0",  # a fresh port each launch, the kernel's choice
        local_addr=LOOPBACK,  # MASTER_ADDR of the ranks: the host's name may resolve to another interface
        max_restarts=0,  # a trial is measured once: a failure is its outcome
        monitor_interval=0.05,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(folder / "logs"), tee=Std.ALL),
    )


def loopback_store() -> "TCPStore":
    """A TCPStore server on a fresh port of 127.0.0.1, listening there only. TCPStore listens on
    every interface whatever host it is given; handed a socket already bound (master_listen_fd),
    it listens on that one, and closes it when the store goes."""
    from torch.distributed import TCPStore

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # as torch sets it on the sockets it makes: the port is free again as soon as the trial ends,
        # its closed connections waiting out TIME_WAIT (Linux lets no second socket listen on it)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, 0))
        listener.listen()
        port = listener.getsockname()[1]
    except OSError:
        listener.close()
        raise
    return TCPStore(LOOPBACK, port, is_master=True, multi_tenant=True, master_listen_fd=listener.detach())


def _loopback_rendezvous(params: Any) -> Any:
    """torch's c10d rendezvous (a `DynamicRendezvousHandler` over the C10d backend, what
    `rdzv_backend="c10d"` builds), with both of its stores on loopback: the rendezvous's own, and
    the one it starts for the ranks (MASTER_ADDR:MASTER_PORT), which torch makes in
    `_create_tcp_store_server` (tests/trial/test_ranks.py checks that torch still does)."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    class Backend(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # torch's registry checks that the handler is the backend it was asked for
            return RENDEZVOUS

    store = loopback_store()
    handler = create_handler(store, Backend(store, params.run_id), params)
    if not callable(getattr(handler, "_create_tcp_store_server", None)):  # replaced below: fail, never listen widely
        raise RuntimeError("this torch's rendezvous no longer starts the ranks' store in _create_tcp_store_server")
    handler._create_tcp_store_server = lambda master_addr, master_port: loopback_store()
    return handler


def _register_loopback_rendezvous() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(RENDEZVOUS, _loopback_rendezvous)  # again: a no-op


def read_rank_results(folder: Path, n: int) -> dict[int, dict[str, Any]]:
    """Each rank's rank-K.json that was written: {rank: payload}."""
    results = {}
    for k in range(n):
        path = folder / RANK_FILE.format(k)
        if path.exists():
            try:
                results[k] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
    return results


def _launcher_failures(failure: Any, folder: Path) -> dict[int, dict[str, Any]]:
    """What the launcher says of each failed rank: its exit code, the time, its message (the
    error file `record` wrote, or the signal), and the tail of its stderr."""
    if failure is None:
        return {}
    from autotune.trial.processes import stderr_tail

    out = {}
    for rank, f in failure.failures.items():
        logs = list(folder.glob(f"logs/**/attempt_0/{f.local_rank}/stderr.log"))
        out[rank] = {
            "exitcode": f.exitcode,
            "timestamp": f.timestamp,
            "message": f.message if isinstance(f.message, str) else json.dumps(f.message)[:500],
            "stderr_tail": stderr_tail(logs[0]) if logs else "",
        }
    return out


def failed_rank(
    results: Mapping[int, Mapping[str, Any]],
    launcher: Mapping[int, Mapping[str, Any]],
    n: int,
    *,
    oom_killed: bool | None = None,
) -> tuple[str, str] | None:
    """(outcome, reason) of the trial when any rank failed, else None. The cause is the rank that
    failed first of its own accord, before the consequences of its failure: a rank's own error
    (its outcome and reason, with the time it failed), or a rank that died without a result
    (the launcher's exit code or signal and its stderr), before a rank whose error is a connection
    the failing one broke, before a rank the launcher stopped with SIGTERM (the agent stops the
    others that way once one fails). A rank missing with no word from the launcher either is
    reported as such. `oom_killed`: whether the kernel's OOM killer killed a process during the
    launch (None: unknown), which tells its SIGKILL from a kill -9 as for a trial of one process."""
    candidates = []  # (how secondary, time, rank, outcome, reason)
    for k, payload in results.items():
        m = Measurement.from_dict(payload["measurement"])
        if m.tokens_per_sec is None:
            secondary = 2 if _communication(m.reason) else 0
            candidates.append((secondary, payload.get("failed_at") or 0.0, k, m.outcome, m.reason))
    for k, f in launcher.items():
        if k in results:
            continue
        tail = f["stderr_tail"] or f["message"] or ""
        outcome, reason = outcomes.classify_exit(f["exitcode"], tail, oom_killed=oom_killed)
        stopped = f["exitcode"] == -signal.SIGTERM
        secondary = 3 if stopped else 2 if _communication(reason) else 1
        candidates.append((secondary, f["timestamp"] or 0.0, k, outcome, reason))
    if not candidates:
        missing = [k for k in range(n) if k not in results]
        if not missing:
            return None
        return outcomes.CRASHED, f"rank {missing[0]} of {n} ended without writing its figures"
    _, _, k, outcome, reason = min(candidates)
    return outcome, f"rank {k} of {n}: {reason}"


def _communication(reason: str | None) -> bool:
    text = (reason or "").lower()
    return any(word in text for word in _COMMUNICATION_WORDS)


def aggregate(payloads: list[Mapping[str, Any]]) -> Measurement:
    """One measurement of the launch from its ranks' (all measured): global tokens/s over the
    slowest rank's window, per-device figures, the straggler ratio, the worst peak memory."""
    measurements = [Measurement.from_dict(p["measurement"]) for p in payloads]
    figures = [
        dict(m.ranks[0], ready_s=p.get("ready_s"), imports_s=p.get("imports_s"), rendezvous_s=p.get("rendezvous_s"))
        for m, p in zip(measurements, payloads)
    ]
    n = len(measurements)
    slowest_index = max(range(n), key=lambda i: figures[i]["window_s"])
    slowest, window = measurements[slowest_index], figures[slowest_index]["window_s"]
    fastest = min(f["window_s"] for f in figures)
    tokens = sum(f["tokens"] for f in figures)
    positions = sum(f["positions"] for f in figures)
    rate = tokens / window
    worst = max(measurements, key=lambda m: m.peak_memory_bytes or 0)
    # outcome: the worst rank's (over the limit, diverged) when one is not ok
    judged = next((m for m in measurements if m.outcome != outcomes.OK), slowest)
    per_device = rate / n
    scale = rate / slowest.tokens_per_sec if slowest.tokens_per_sec else None
    result = Measurement.from_dict(slowest.to_dict())
    result.outcome, result.reason = judged.outcome, judged.reason
    result.tokens_per_sec = rate
    result.tokens_per_sec_ci95 = _scaled(slowest.tokens_per_sec_ci95, scale)
    result.padded_tokens_per_sec = positions / window
    result.padded_tokens_per_sec_ci95 = _scaled(
        slowest.padded_tokens_per_sec_ci95, positions / window / (slowest.padded_tokens_per_sec or 1)
    )
    result.padding_fraction = 1.0 - tokens / positions if positions else None
    result.data_wait_fraction = max(f["data_wait_fraction"] or 0.0 for f in figures)
    # per device: MFU is linear in the throughput, each rank's against its own device
    result.mfu = _per_device(slowest.mfu, per_device, slowest.tokens_per_sec)
    result.mfu_at_context = _per_device(slowest.mfu_at_context, per_device, slowest.tokens_per_sec)
    result.mfu_measured_peak = _per_device(slowest.mfu_measured_peak, per_device, slowest.tokens_per_sec)
    result.peak_memory_bytes, result.peak_memory_source = worst.peak_memory_bytes, worst.peak_memory_source
    result.allocator_peak_bytes = worst.allocator_peak_bytes
    result.allocator_reserved_peak_bytes = worst.allocator_reserved_peak_bytes
    result.window_peak_memory_bytes = max((m.window_peak_memory_bytes or 0) for m in measurements) or None
    result.host_peak_memory_bytes = max((m.host_peak_memory_bytes or 0) for m in measurements) or None
    result.unstable = any(m.unstable for m in measurements)
    result.energy_joules = result.joules_per_token = result.energy_source = None  # counters are per device
    result.energy_note = "several ranks: energy is not aggregated across devices"
    result.world_size = n
    result.per_device_tokens_per_sec = per_device
    result.straggler_ratio = window / fastest if fastest > 0 else None
    result.ranks = sorted(figures, key=lambda f: f["rank"])
    starts = [f["ready_s"] for f in figures if f.get("ready_s") is not None]
    if starts:
        result.phase_s["rank_start"] = max(starts)  # launch to the slowest rank's entry
    for name in ("imports", "rendezvous"):  # the slowest rank's
        values = [f[f"{name}_s"] for f in figures if f.get(f"{name}_s") is not None]
        if values:
            result.phase_s[f"rank_{name}"] = max(values)
    return result


def _scaled(interval: list[float] | None, factor: float | None) -> list[float] | None:
    return [v * factor for v in interval] if interval and factor else None


def _per_device(value: float | None, per_device: float, rank_rate: float | None) -> float | None:
    return value * per_device / rank_rate if value is not None and rank_rate else None


# --- a rank -------------------------------------------------------------------------------------


def rank_main(request_path: str, folder: str, parent_pid: int, launched: float) -> int:
    """One rank (`python -m autotune.trial --rank REQUEST FOLDER PARENT_PID LAUNCHED`): join the
    group, measure with the one loop, write rank-K.json. Exits 1 when it measured nothing, so the
    agent stops the other ranks rather than leave them waiting on it."""
    from autotune.trial.processes import die_with_parent

    die_with_parent(parent_pid)
    ready = time.time()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    print(
        f"autotune rank {rank} of {os.environ['WORLD_SIZE']}: rendezvous at "
        f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
        file=sys.stderr,
        flush=True,
    )
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    payload: dict[str, Any] = {"rank": rank, "ready_s": ready - launched}
    result = _measure_rank(request, local, payload)
    payload["finished_at"] = time.time()
    if result.tokens_per_sec is None:
        payload["failed_at"] = time.time()
    payload["measurement"] = result.to_dict()
    path = Path(folder, RANK_FILE.format(rank))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    os.replace(tmp, path)
    return 0 if result.tokens_per_sec is not None else 1


def _measure_rank(request: Mapping[str, Any], local_rank: int, payload: dict[str, Any]) -> Measurement:
    t = time.perf_counter()
    import torch.distributed as dist

    from autotune.config import RunSpec, TrainConfig
    from autotune.device import DeviceInfo
    from autotune.errors import AutotuneError
    from autotune.measure.loop import measure

    payload["imports_s"] = time.perf_counter() - t  # torch and the measuring loop, in a fresh interpreter
    spec, cfg = RunSpec.from_dict(request["spec"]), TrainConfig.from_dict(request["config"])
    cuda = spec.device_kind == "cuda"
    if cuda:
        spec = dataclasses.replace(spec, device=f"cuda:{local_rank}")  # rank k on the k-th visible GPU
    info = DeviceInfo.from_dict(request["device"]) if request.get("device") and not cuda else None
    try:
        t = time.perf_counter()
        if cuda:
            import torch

            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
        payload["rendezvous_s"] = time.perf_counter() - t
        return measure(spec, cfg, info)
    except AutotuneError as exc:  # bad input reaching a rank: record it, don't crash
        return Measurement.failed(cfg.to_dict(), *outcomes.bad_input_in_trial(exc))
    except Exception as exc:  # noqa: BLE001 - joining the group failed: the rank's reason
        return Measurement.failed(cfg.to_dict(), *outcomes.classify_exception(exc))
