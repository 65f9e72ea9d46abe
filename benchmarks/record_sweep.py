"""Measure every configuration of a (small) space and keep the results as data.

    python benchmarks/record_sweep.py --model gpt2-tiny --device cpu \
        --space benchmarks/spaces/cpu_sweep.yaml --out benchmarks/data/cpu_gpt2_tiny_sweep.json

Each configuration runs through `autotune.trial.runner.run_trial`: a fresh process, the same
measuring core as `search`. Configurations the space's rules or the device reject are
recorded `unsupported` without starting a process, as the tuner does."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone

import _common  # noqa: F401  (puts the checkout on sys.path)
from _common import config_key, enumerate_space, machine

from autotune.config import RunSpec
from autotune.device import describe
from autotune.errors import UnsupportedConfig
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.model.gpt import MODEL_SIZES
from autotune.search.space_file import load_space
from autotune.trial.runner import run_trial


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2-tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--space", default="benchmarks/spaces/cpu_sweep.yaml")
    p.add_argument("--out", default="benchmarks/data/cpu_gpt2_tiny_sweep.json")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--trial-timeout", type=float, default=300.0)
    args = p.parse_args()

    shape = MODEL_SIZES[args.model]
    space = load_space(args.space, n_layer=shape.n_layer, seq_len=shape.block_size)
    device = describe(args.device)
    caps = DeviceCapabilities.detect(device.kind, device.capability_tuple)
    spec = RunSpec(model=args.model, device=args.device, warmup=args.warmup, steps=args.steps)
    configs = list(enumerate_space(space))
    records = []
    started, load_before = time.time(), os.getloadavg()[0]
    for i, (params, cfg) in enumerate(configs):
        reason = space.violation(cfg)
        if reason is None:
            try:
                check_supported(cfg, caps)
            except UnsupportedConfig as exc:
                reason = str(exc)
        if reason is not None:
            rec = {"outcome": "unsupported", "reason": reason, "tokens_per_sec": None, "peak_memory_bytes": None}
        else:
            r = run_trial(spec, cfg, timeout_s=args.trial_timeout, device=device)
            rec = {
                "outcome": r.outcome,
                "reason": r.reason,
                "tokens_per_sec": r.tokens_per_sec,
                "peak_memory_bytes": r.peak_memory_bytes,
                "step_time_cv": (r.measurement or {}).get("step_time_cv"),
                "wall_s": round(r.wall_s, 2),
            }
        records.append({"params": params, "config": cfg.to_dict(), "key": config_key(cfg), **rec})
        tps = rec["tokens_per_sec"]
        print(
            f"[{i + 1}/{len(configs)}] {rec['outcome']:<12} {tps or 0:>10.0f} tok/s  "
            f"{(rec['peak_memory_bytes'] or 0) / 2**20:>6.0f} MiB  {params}",
            file=sys.stderr,
            flush=True,
        )
    data = {
        "format": "autotune.sweep",
        "version": 1,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": args.model,
        "device": device.to_dict(),
        "machine": machine(),
        "run": {"steps": args.steps, "warmup": args.warmup, "min_time_s": spec.min_time_s},
        "space": space.to_dict(),
        "space_source": args.space,
        "space_hash": space.hash,
        "n_layer": shape.n_layer,
        "seq_len": shape.block_size,
        "sweep_wall_s": round(time.time() - started, 1),
        # the sweep itself keeps about one core busy: much above 1 means other jobs were running
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "configurations": records,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {len(records)} configurations to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
