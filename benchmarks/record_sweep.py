"""Measure every configuration of a space and keep the results as data.

    python benchmarks/record_sweep.py --model gpt2-tiny --device cpu \
        --space benchmarks/spaces/cpu_sweep_large.yaml --out benchmarks/data/cpu_gpt2_tiny_sweep_large.json [--resume]

Each configuration runs through `autotune.trial.runner.run_trial`: a fresh process, the same
measuring core as `search`. Configurations the space's rules or the device reject are
recorded `unsupported` without starting a process, as the tuner does (they cost nothing).

Per configuration the file keeps what a replay needs to count seconds, not only trials:
tokens/s, peak memory, outcome, and the trial's wall time split into

  process   wall - compile - timed: starting the process (fork, imports), building the model,
            optimizer and data, warm-up steps and tearing down; what the tuner pays per trial
  compile   the warm-up's time beyond the steady step time (Measurement.compile_time_s)
  timed     the timed steps (the runner's `timed` phase)

so process + compile + timed = wall. The fork server starts before the first configuration, as
`search` starts it with its probe of the model, so that one-off cost is in no trial's.

Every trial compiles from scratch: its inductor cache is a fresh TORCHINDUCTOR_CACHE_DIR,
removed afterwards (the fork server never compiles, and inductor reads the variable when it
first compiles, in the trial), as a new study on a new machine would. Checked: of three
trials of one compiled configuration, the two with fresh caches compiled in 105 s and 83 s,
the one reusing the first's cache in 14 s (load average ~5).

The file is rewritten (atomically) after every configuration: a kill loses at most the one
running, and `--resume` measures only what the file does not hold yet."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (puts the checkout on sys.path)
from _common import config_key, enumerate_space, machine

from autotune.config import RunSpec, TrainConfig
from autotune.device import DeviceInfo, describe
from autotune.errors import UnsupportedConfig
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.measure import outcomes
from autotune.model.gpt import MODEL_SIZES
from autotune.space.definition import SearchSpace
from autotune.space.file import load_space
from autotune.trial.probe import probe
from autotune.trial.runner import TrialResult, run_trial


def trial_costs(result: TrialResult) -> dict[str, float]:
    """A trial's wall seconds as process + compile + timed (see the module's docstring). A trial
    that reported no measurement (timeout, crash, the RSS watchdog) is all process."""
    m = result.measurement
    compile_s = float(m.compile_time_s or 0.0) if m else 0.0
    timed_s = float(result.phase_s.get("timed", 0.0))
    process_s = max(0.0, result.wall_s - compile_s - timed_s)
    return {"process_s": round(process_s, 3), "compile_s": round(compile_s, 3), "timed_s": round(timed_s, 3)}


def rejection(space: SearchSpace, cfg: TrainConfig, caps: DeviceCapabilities) -> str | None:
    """Why the tuner would prune `cfg` without starting a process, or None."""
    reason = space.violation(cfg)
    if reason is None:
        try:
            check_supported(cfg, caps)
        except UnsupportedConfig as exc:
            reason = str(exc)
    return reason


def measure_one(spec: RunSpec, cfg: TrainConfig, device: DeviceInfo, timeout_s: float) -> dict[str, Any]:
    """One configuration, in a fresh process with an empty compile cache of its own."""
    cache = tempfile.mkdtemp(prefix="autotune-sweep-inductor-")
    load = os.getloadavg()[0]
    try:
        r = run_trial(spec, cfg, timeout_s=timeout_s, device=device, env={"TORCHINDUCTOR_CACHE_DIR": cache})
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    m = r.measurement
    return {
        "outcome": r.outcome,
        "reason": r.reason,
        "tokens_per_sec": r.tokens_per_sec,
        "peak_memory_bytes": r.peak_memory_bytes,
        "step_time_cv": m.step_time_cv if m else None,
        "wall_s": round(r.wall_s, 3),
        **trial_costs(r),
        "phase_s": {k: round(v, 3) for k, v in r.phase_s.items()},
        "load_1min": load,  # when it started: other jobs on the machine slow it
    }


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2-tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--space", default="benchmarks/spaces/cpu_sweep_large.yaml")
    p.add_argument("--out", default="benchmarks/data/cpu_gpt2_tiny_sweep_large.json")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--min-time", type=float, default=0.0, help="minimum timed seconds per configuration")
    p.add_argument("--trial-timeout", type=float, default=300.0)
    p.add_argument("--resume", action="store_true", help="keep the configurations --out already holds")
    p.add_argument("--limit", type=int, default=None, help="stop after this many configurations (timing a sweep)")
    args = p.parse_args()

    shape = MODEL_SIZES[args.model]
    space = load_space(args.space, n_layer=shape.n_layer, seq_len=shape.block_size)
    device = describe(args.device)
    caps = DeviceCapabilities.detect(device.kind, device.capability_tuple)
    spec = RunSpec(model=args.model, device=args.device, warmup=args.warmup, steps=args.steps, min_time_s=args.min_time)
    out = Path(args.out)
    configs = list(enumerate_space(space))[: args.limit]
    data: dict[str, Any] = {
        "format": "autotune.sweep",
        "version": 2,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": args.model,
        "device": device.to_dict(),
        "machine": machine(),
        "run": {"steps": spec.steps, "warmup": spec.warmup, "min_time_s": spec.min_time_s},
        "compile_cache": "a fresh TORCHINDUCTOR_CACHE_DIR per configuration",
        # Trials fork from a server that imported torch with this environment: its thread count
        # is every trial's (on a shared machine, one thread keeps steps from waiting on a
        # descheduled sibling thread).
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "space": space.to_dict(),
        "space_source": args.space,
        "space_hash": space.hash,
        "n_layer": shape.n_layer,
        "seq_len": shape.block_size,
        "complete": False,
        "configurations": [],
    }
    if args.resume and out.exists():
        held = json.loads(out.read_text(encoding="utf-8"))
        if held.get("space_hash") != space.hash or held.get("run") != data["run"]:
            raise SystemExit(f"{out} was recorded with another space or run settings: give another --out")
        data = {**held, "complete": False}
    done = {r["key"] for r in data["configurations"]}
    # As `search` does before its first trial: the probe starts the fork server, so no
    # configuration's wall time carries that one-off start.
    probe(args.model, timeout_s=args.trial_timeout)
    started = time.time()
    data.setdefault("load_average_1min", {})["before"] = data.get("load_average_1min", {}).get(
        "before", os.getloadavg()[0]
    )
    for i, (params, cfg) in enumerate(configs):
        key = config_key(cfg)
        if key in done:
            continue
        reason = rejection(space, cfg, caps)
        if reason is not None:
            rec = {"outcome": outcomes.UNSUPPORTED, "reason": reason, "tokens_per_sec": None}
            rec |= {"peak_memory_bytes": None, "wall_s": 0.0, "process_s": 0.0, "compile_s": 0.0, "timed_s": 0.0}
        else:
            rec = measure_one(spec, cfg, device, args.trial_timeout)
        data["configurations"].append({"params": params, "config": cfg.to_dict(), "key": key, **rec})
        data["sweep_wall_s"] = round(data.get("sweep_wall_s", 0.0) + time.time() - started, 1)
        started = time.time()
        write_atomic(out, data)
        print(
            f"[{i + 1}/{len(configs)}] {rec['outcome']:<12} {rec['tokens_per_sec'] or 0:>10.0f} tok/s  "
            f"{(rec['peak_memory_bytes'] or 0) / 2**20:>6.0f} MiB  wall {rec['wall_s']:>5.1f} s "
            f"(compile {rec['compile_s']:.1f})  load {rec.get('load_1min', 0):.1f}  {params}",
            file=sys.stderr,
            flush=True,
        )
    loads = [r["load_1min"] for r in data["configurations"] if "load_1min" in r]
    data["load_average_1min"] |= {
        "after": os.getloadavg()[0],
        "median_during": sorted(loads)[len(loads) // 2] if loads else None,
        "max_during": max(loads, default=None),
        # the sweep itself keeps about one core busy: much above 1 means other jobs were running
        "note": "1-minute load average of the machine; the sweep alone is about 1",
    }
    data["complete"] = len(data["configurations"]) == len(configs)
    write_atomic(out, data)
    print(f"wrote {len(data['configurations'])} configurations to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
