"""Tuner overhead: where a trial's wall time goes, beyond the steps it measures.

    python benchmarks/overhead.py [--json] [--trials 5]

Runs a few trials of one configuration (gpt2-tiny, CPU, no compile) through
autotune.trial.runner.run_trial, the search's own path, and splits each trial's wall time with
the phases the runner and the measuring core record (TrialResult.phase_s):

  spawn_to_ready  from spawning the process until the worker has imported the measuring core
                  (interpreter start + imports; process_start is the part seen from inside)
  setup           model, optimizer (the first construction imports torch._dynamo), data loader
  compile         warm-up time beyond the steady step time (0 without torch.compile)
  warmup          the rest of the warm-up steps
  timed           the timed steps (the measurement itself)
  other           measure() bookkeeping outside those phases (figures, memory release)
  teardown        from the result being measured to the process group being gone

overhead = wall - timed - compile: what the tuner spends per trial beyond measuring."""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import _common  # noqa: F401
from _common import md_table

from autotune.config import RunSpec, TrainConfig
from autotune.device import describe
from autotune.trial.runner import run_trial

PHASES = (
    "spawn_to_ready",
    "process_start",
    "setup",
    "compile",
    "warmup",
    "timed",
    "other",
    "teardown",
    "overhead",
    "wall",
)
TARGET_S = 3.0


def split(result) -> dict[str, float]:
    p = dict(result.phase_s)
    compile_s = float(result.measurement.compile_time_s or 0.0) if result.measurement else 0.0
    out = {
        "spawn_to_ready": p.get("spawn_to_ready", 0.0),
        "process_start": p.get("process_start", 0.0),
        "setup": p.get("setup", 0.0),
        "compile": compile_s,
        "warmup": max(0.0, p.get("warmup", 0.0) - compile_s),
        "timed": p.get("timed", 0.0),
        "other": max(0.0, p.get("total", 0.0) - p.get("setup", 0.0) - p.get("warmup", 0.0) - p.get("timed", 0.0)),
        "teardown": p.get("teardown", 0.0),
        "wall": result.wall_s,
    }
    out["overhead"] = result.wall_s - out["timed"] - compile_s
    return out


def run(trials: int, steps: int, warmup: int) -> dict:
    spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=warmup, steps=steps)
    cfg = TrainConfig(
        num_workers=0,
        token_budget=1024,
        batching="padded",
        amp_dtype="float32",
        compile_mode="none",
        sdpa_backend="math",
    )
    device = describe("cpu")
    rows = []
    for _ in range(trials):
        r = run_trial(spec, cfg, timeout_s=300, device=device)
        if r.outcome != "ok":
            raise SystemExit(f"trial ended {r.outcome}: {r.reason}")
        rows.append(split(r))
    median = {k: statistics.median(row[k] for row in rows) for k in PHASES}
    return {
        "trials": rows,
        "median_s": median,
        "target_overhead_s": TARGET_S,
        "meets_target": median["overhead"] <= TARGET_S,
        "config": cfg.to_dict(),
        "run": {"steps": steps, "warmup": warmup},
        "note": "CPU shared with other jobs: figures are noisy",
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    args = p.parse_args()
    out = run(args.trials, args.steps, args.warmup)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"Tuner overhead per trial: gpt2-tiny, CPU, {args.trials} trials, median seconds "
        f"(target overhead <= {TARGET_S:.0f} s: {'met' if out['meets_target'] else 'NOT met'})\n"
    )
    print(
        md_table(
            ["phase", "median s", "min s", "max s"],
            [
                [
                    k,
                    f"{out['median_s'][k]:.2f}",
                    f"{min(r[k] for r in out['trials']):.2f}",
                    f"{max(r[k] for r in out['trials']):.2f}",
                ]
                for k in PHASES
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
