"""End to end: a full `autotune search` of gpt2-tiny on the CPU (the default CPU space,
12 trials, reference trials included), in a temporary directory.

    python benchmarks/end_to_end.py [--json] [--n-trials 12] [--steps 20 --warmup 3]

Reports the wall time of the command, the time from the study's first trial starting to
the best trial completing, and the best tokens/s against the baseline and the checklist."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import _common  # noqa: F401
import optuna
from _common import ROOT, md_table


def run(n_trials: int, steps: int, warmup: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="autotune-e2e-") as tmp:
        storage = f"sqlite:///{tmp}/e2e.db"
        cmd = [
            sys.executable,
            "-m",
            "autotune",
            "search",
            "--model",
            "gpt2-tiny",
            "--device",
            "cpu",
            "--n-trials",
            str(n_trials),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--seed",
            str(seed),
            "--study",
            "e2e",
            "--storage",
            storage,
            "--recipe",
            f"{tmp}/recipe.json",
            "--json",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        started = time.time()
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.time() - started
        if proc.returncode != 0:
            raise SystemExit(f"search failed ({proc.returncode}): {proc.stderr[-2000:]}")
        summary = json.loads(proc.stdout)
        study = optuna.load_study(study_name="e2e", storage=storage)
        trials = study.get_trials(deepcopy=False)
        t0 = min(t.datetime_start for t in trials if t.datetime_start)
        best_number = (summary.get("best") or {}).get("number")
        best = next(t for t in trials if t.number == best_number)
        phases = [t.user_attrs.get("wall_s") or 0.0 for t in trials]
    tps = lambda t: (t or {}).get("tokens_per_sec")  # noqa: E731
    return {
        "n_trials": len(trials),
        "counts": summary.get("counts"),
        "wall_s": wall,
        "time_to_best_s": (best.datetime_complete - t0).total_seconds(),
        "best_trial": best_number,
        "best_config": best.user_attrs.get("config"),
        "best_tokens_per_sec": tps(summary.get("best")),
        "baseline_tokens_per_sec": tps(summary.get("baseline")),
        "checklist_tokens_per_sec": tps(summary.get("checklist")),
        "speedup_vs_baseline": summary.get("speedup_vs_baseline"),
        "speedup_vs_checklist": summary.get("speedup_vs_checklist"),
        "trial_process_wall_s_total": sum(phases),
        "run": {"steps": steps, "warmup": warmup, "seed": seed},
        "note": "CPU shared with other jobs: figures are noisy",
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--n-trials", type=int, default=12)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = run(args.n_trials, args.steps, args.warmup, args.seed)
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return 0
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    print(
        f"End to end: autotune search, gpt2-tiny on CPU, default CPU space, {out['n_trials']} trials {out['counts']}\n"
    )
    print(
        md_table(
            [
                "wall time",
                "time to best",
                "best trial",
                "best tok/s",
                "baseline tok/s",
                "checklist tok/s",
                "vs baseline",
                "vs checklist",
            ],
            [
                [
                    f"{out['wall_s']:.0f} s",
                    f"{out['time_to_best_s']:.0f} s",
                    out["best_trial"],
                    f(out["best_tokens_per_sec"], ",.0f"),
                    f(out["baseline_tokens_per_sec"], ",.0f"),
                    f(out["checklist_tokens_per_sec"], ",.0f"),
                    f(out["speedup_vs_baseline"], ".2f") + "x",
                    f(out["speedup_vs_checklist"], ".2f") + "x",
                ]
            ],
        )
    )
    print(f"\nbest configuration: {out['best_config']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
