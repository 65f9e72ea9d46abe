"""Scaling efficiency of a study of several ranks (`--nproc-per-node N`): its best configuration
measured once more on ONE rank (parallelism none, the same micro-batch and accumulation on that
rank: its share of the global batch), on the same host, and the best's global tokens/s set
against N times that. 1.0 is perfect data-parallel scaling; what it lacks is the cost of the
gradient communication, of FSDP2's gathers, and of ranks waiting on one another (the
straggler ratio says how much of that is waiting).

On a CPU, the single rank gets the CPUs one of the N ranks had (OMP_NUM_THREADS = CPUs // N):
it stands for one device of the N. The reference is kept as a study attr (once per best trial:
a resumed study measures it again only for a new best)."""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.config import TrainConfig, usable_cpus
from autotune.trial.runner import run_trial

SINGLE_RANK_ATTR = "single_rank_reference"


def single_rank_config(config: dict[str, Any]) -> TrainConfig:
    """The best's configuration on one rank: parallelism none, DDP's and FSDP2's knobs reset."""
    return TrainConfig.from_dict(config).with_overrides({"parallelism": "none"})


def measure_single_rank(study, summary, ctx) -> dict[str, Any] | None:
    """Measure the best's single-rank reference unless it is known for this best; return it."""
    ranks = ctx.spec.nproc_per_node
    best = summary.best
    if ranks <= 1 or best is None or not best.config:
        return None
    known = study.user_attrs.get(SINGLE_RANK_ATTR)
    if isinstance(known, dict) and known.get("trial") == best.number:
        return known
    cfg = single_rank_config(best.config)
    batch = ctx.spec.global_batch_tokens
    spec = dataclasses.replace(
        ctx.spec,
        nproc_per_node=1,
        global_batch_tokens=batch // ranks if batch else None,  # one rank's share: the same accumulation
        prune_below_tokens_per_sec=None,
    )
    env = {"OMP_NUM_THREADS": str(max(1, usable_cpus() // ranks))} if ctx.device.kind == "cpu" else None
    result = run_trial(spec, cfg, timeout_s=ctx.trial_timeout_s, device=ctx.device, env=env)
    reference = {
        "trial": best.number,
        "nproc_per_node": ranks,
        "config": cfg.to_dict(),
        "outcome": str(result.outcome),
        "reason": result.reason,
        "tokens_per_sec": result.tokens_per_sec,
        "peak_memory_bytes": result.peak_memory_bytes,
    }
    study.set_user_attr(SINGLE_RANK_ATTR, reference)
    return reference
