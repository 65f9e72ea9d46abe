"""Runs one trial in a fresh process, in its own process group, and decides its outcome.

The group is killed whole at the timeout (DataLoader workers included, so nothing is left
behind), after the trial ends whatever happened, and on Ctrl-C. On CPU the runner also
watches the group's resident memory: far past the limit it stops the trial before the
machine starts swapping, and records it `over_memory_limit`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from autotune.config import RunSpec, TrainConfig
from autotune.device import DeviceInfo, group_rss_bytes
from autotune.knobs.allocator import allocator_env
from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.trial._proc import kill_group, stderr_tail

POLL_S = 0.05


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
    KeyboardInterrupt kills the child's group and propagates."""
    with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
        request, result, stderr_path = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "stderr")
        request.write_text(
            json.dumps(
                {"spec": spec.to_dict(), "config": cfg.to_dict(), "device": device.to_dict() if device else None}
            )
        )
        spawned = time.time()
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "autotune.trial", str(request), str(result), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                start_new_session=True,  # its own process group, killed whole
                env=_child_env(env, cfg),
                cwd=os.getcwd(),
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
            return outcomes.timed_out(timeout_s)
        if limit:
            peak = max(peak, group_rss_bytes(proc.pid))
            verdict = outcomes.stopped_over_memory(peak, limit)
            if verdict is not None:
                return verdict
        time.sleep(POLL_S)
    return None


def _collect(
    returncode: int, verdict: tuple[str, str] | None, result: Path, stderr_path: Path, spawned: float, wall: float
) -> TrialResult:
    if verdict is not None:
        return TrialResult(verdict[0], verdict[1], wall_s=wall)
    if result.exists():
        payload = json.loads(result.read_text())
        m = Measurement.from_dict(payload["measurement"])
        phases = dict(m.phase_s)
        phases["spawn_to_ready"] = payload["ready_at"] - spawned
        phases["teardown"] = max(0.0, wall - (payload["ready_at"] - spawned) - phases.get("total", 0.0))
        return TrialResult(m.outcome, m.reason, m, wall_s=wall, phase_s=phases)
    outcome, reason = outcomes.classify_exit(returncode, stderr_tail(stderr_path))
    return TrialResult(outcome, reason, wall_s=wall)


def _child_env(extra: dict[str, str] | None, cfg: TrainConfig) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # NVML's order: indices then agree
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    # The allocator reads its settings once, when CUDA starts: the trial starts with them.
    env.update(allocator_env(cfg, env))
    return env
