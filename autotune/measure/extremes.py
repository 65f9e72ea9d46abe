"""The extreme shapes: one step on each of the largest batches the sampler can produce for this
data, right before the timed window, so a run's peak memory is its worst case and not what a
few dozen random batches happened to draw (Lightning #8028 and #21154: a batch size chosen by
a short probe runs out of memory later in training, on the batch the probe never saw).

Padded batches are cut widest first to at most token_budget positions, so an epoch holds a
batch of every width bucket its documents reach, each (token_budget // width, width), and one
smaller last batch (`data.batching.distinct_batch_shapes`). Two are extreme:

    the widest bucket at its largest batch   attention's memory grows with the width squared
    the largest B x W                        activations grow with the positions

(often the same batch). Fixed and packed batching have one shape, which every timed step runs:
no extra step is needed, and the measurement says so (`note`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from autotune.measure.warmup import synthetic_batch


@dataclass(frozen=True)
class Extremes:
    """The shapes to run before the window, (batch size, width) each, or why there are none."""

    shapes: list[tuple[int, int]] = field(default_factory=list)
    note: str | None = None


def extreme_shapes(shapes: list[tuple[int, int]] | None) -> Extremes:
    """The extreme shapes among a loader's distinct (batch size, width) shapes."""
    if not shapes:
        return Extremes(note="the loader's batch shapes are unknown (not autotune's collate): no extreme step")
    if len(shapes) == 1:
        b, w = shapes[0]
        return Extremes(note=f"one batch shape ({b} x {w}), which every timed step runs: no extreme step needed")
    widest = max(w for _, w in shapes)
    widest_batch = (max(b for b, w in shapes if w == widest), widest)
    largest = max(shapes, key=lambda s: (s[0] * s[1], s[1]))
    return Extremes(shapes=[widest_batch] if largest == widest_batch else [widest_batch, largest])


def run_extremes(
    step: Callable[..., torch.Tensor],
    extremes: Extremes,
    *,
    vocab_size: int,
    documents: bool,
    sync: Callable[[], None],
    seed: int = 0,
    accumulation_steps: int = 1,
) -> int:
    """One real training step on a batch of each extreme shape (cycled to whole optimizer
    steps, so the window still starts at an optimizer-step boundary), synchronized; returns
    the steps run."""
    if not extremes.shapes:
        return 0
    generator = torch.Generator().manual_seed(seed + 1)  # not warm-up's batches again
    batches = [synthetic_batch(s, vocab_size, generator, documents=documents) for s in extremes.shapes]
    count = -(-len(batches) // accumulation_steps) * accumulation_steps
    for k in range(count):
        step(*batches[k % len(batches)])
    sync()
    return count
