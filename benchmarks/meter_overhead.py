"""The meter's overhead: one training loop timed with and without `recipe.meter` around it.

    python benchmarks/meter_overhead.py [--steps 40] [--rounds 5] [--json]

gpt2-tiny on the CPU, packed batches of 512 tokens, AdamW: the README's loop. Each round runs
the loop plain, then with the meter (`for batch in meter.batches(loader)`), on the same model and
batches, the order alternating between rounds so a machine that slows down meanwhile weighs on
both; the first WARMUP steps of each run are left out. Each step is timed on the host clock, from
asking for the batch to the end of the optimizer step (data wait included: the meter's own work
lies between a step's end and the next batch). Then the meter's own work per step alone: begin()
and step(batch) called back to back, no training between them. The overhead is the median step time with the
meter over the median step time plain, less one, over every round's steps together. A CPU step
is synchronous, so this is the meter's whole cost; on CUDA its per-step work is the same host
work (an event recorded, the labels counted into a device tensor) and no synchronize."""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time

import _common  # noqa: F401
import numpy as np
import torch

from autotune.config import TrainConfig
from autotune.model.load import build_model
from autotune.recipe import Recipe

WARMUP = 3


def timed_steps(model, optimizer, batches, meter=None) -> list[float]:
    """The loop's step times (host clock); through `meter.batches` when a meter is given."""
    times = []
    stream = meter.batches(batches) if meter is not None else batches
    start = time.perf_counter()
    for batch in stream:
        output = model(**batch)
        getattr(output, "loss", output).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        now = time.perf_counter()
        times.append(now - start)
        start = now
    return times[WARMUP:]


def meter_work_s(recipe, model, batch, calls: int = 2000) -> float:
    """The meter's own work per step, alone (no training between the calls): the median of
    `calls` begin()+step(batch) pairs, each timed on the host clock."""
    meter = recipe.meter(model, warmup_steps=WARMUP)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        meter.begin()
        meter.step(batch)
        times.append(time.perf_counter() - start)
    meter.close()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    recipe = Recipe(config=TrainConfig(token_budget=512, batching="packed"), model={"name": "gpt2-tiny"})
    model = recipe.apply_to_model(build_model("gpt2-tiny"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 256, 129).tolist() for _ in range(4 * args.steps)]
    batches = list(itertools.islice(iter(recipe.dataloader(documents, for_model=model)), args.steps))
    plain: list[float] = []
    metered: list[float] = []
    for round_ in range(args.rounds):
        for with_meter in (round_ % 2 == 0, round_ % 2 == 1):
            if with_meter:
                meter = recipe.meter(model, warmup_steps=WARMUP)
                metered += timed_steps(model, optimizer, iter(batches), meter)
                meter.close()
            else:
                plain += timed_steps(model, optimizer, iter(batches))
    result = {
        "steps_each": len(plain),
        "plain_median_s": statistics.median(plain),
        "metered_median_s": statistics.median(metered),
        "overhead": statistics.median(metered) / statistics.median(plain) - 1.0,
        "meter_work_per_step_s": meter_work_s(recipe, model, batches[0]),
        "torch_threads": torch.get_num_threads(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"gpt2-tiny, CPU, {result['steps_each']} steps each: plain {result['plain_median_s'] * 1e3:.2f} ms, "
            f"with the meter {result['metered_median_s'] * 1e3:.2f} ms (median step): "
            f"overhead {result['overhead']:+.1%}; "
            f"the meter's own work {result['meter_work_per_step_s'] * 1e6:.0f} us a step"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
