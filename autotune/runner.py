"""Runs one trial in a fresh process, in its own process group, and decides its outcome.

The group is killed whole at the timeout (DataLoader workers included, so nothing is left
behind), after the trial ends whatever happened, and on Ctrl-C. On CPU the runner also
watches the group's resident memory: far past the limit it stops the trial before the
machine starts swapping, and records it `over_memory_limit`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import outcomes
from autotune.config import RunSpec, TrainConfig
from autotune.device import DeviceInfo

POLL_S = 0.05
# On CPU, a trial whose resident memory passes this multiple of the limit is stopped early:
# it is already infeasible, and letting it grow could take the machine down with it.
RSS_KILL_FACTOR = 1.5


@dataclass
class TrialResult:
    outcome: str
    reason: str | None
    measurement: dict[str, Any] | None = None  # Measurement.to_dict() when the process reported
    wall_s: float = 0.0  # from spawning the process to its end
    phase_s: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_sec(self) -> float | None:
        return (self.measurement or {}).get("tokens_per_sec")

    @property
    def peak_memory_bytes(self) -> int | None:
        return (self.measurement or {}).get("peak_memory_bytes")


def run_trial(spec: RunSpec, cfg: TrainConfig, *, timeout_s: float, device: DeviceInfo | None = None,
              env: dict[str, str] | None = None, on_start=None) -> TrialResult:
    """Measure `cfg` in a child process. Never raises for what the trial does; a
    KeyboardInterrupt kills the child's group and propagates."""
    with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
        request, result, stderr_path = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "stderr")
        request.write_text(json.dumps({"spec": spec.to_dict(), "config": cfg.to_dict(),
                                       "device": device.to_dict() if device else None}))
        spawned = time.time()
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "autotune.trial_worker", str(request), str(result), str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                start_new_session=True,  # its own process group, killed whole
                env=_child_env(env), cwd=os.getcwd(),
            )
            try:
                if on_start is not None:  # inside the try: a Ctrl-C here must still kill the group
                    on_start(proc.pid)
                verdict = _wait(proc, timeout_s, spec)
            finally:
                kill_group(proc.pid)  # workers and anything else the trial started
                proc.wait()
        wall = time.time() - spawned
        return _collect(proc.returncode, verdict, result, stderr_path, spawned, wall)


def _wait(proc: subprocess.Popen, timeout_s: float, spec: RunSpec) -> tuple[str, str] | None:
    """Wait for the process; return (outcome, reason) if the runner had to stop it."""
    deadline = time.monotonic() + timeout_s
    limit = spec.memory_limit_bytes if spec.device_kind == "cpu" else None
    peak = 0
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return outcomes.TIMEOUT, f"no result after {timeout_s:.0f} s; the process group was killed"
        if limit:
            peak = max(peak, group_rss_bytes(proc.pid))
            if peak > RSS_KILL_FACTOR * limit:
                return outcomes.OVER_MEMORY_LIMIT, (
                    f"resident memory {outcomes.format_bytes(peak)} passed {RSS_KILL_FACTOR}x the limit "
                    f"{outcomes.format_bytes(limit)}; stopped early")
        time.sleep(POLL_S)
    return None


def _collect(returncode: int, verdict: tuple[str, str] | None, result: Path, stderr_path: Path,
             spawned: float, wall: float) -> TrialResult:
    if verdict is not None:
        return TrialResult(verdict[0], verdict[1], wall_s=wall)
    if result.exists():
        payload = json.loads(result.read_text())
        m = payload["measurement"]
        phases = dict(m.get("phase_s") or {})
        phases["spawn_to_ready"] = payload["ready_at"] - spawned
        phases["teardown"] = max(0.0, wall - (payload["ready_at"] - spawned) - phases.get("total", 0.0))
        return TrialResult(m["outcome"], m.get("reason"), m, wall_s=wall, phase_s=phases)
    outcome, reason = outcomes.classify_exit(returncode, stderr_tail(stderr_path))
    return TrialResult(outcome, reason, wall_s=wall)


def _child_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # NVML's order: indices then agree
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the group (the trial and its DataLoader workers)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of stat: process group id
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
        except (OSError, IndexError, ValueError):
            continue
    return total


def stderr_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
