"""Warm-up: everything that happens once per shape, done before the clock starts.

A training step of a new shape pays for things a steady step does not: dynamo compiles
(or recompiles), inductor generates the backward graph at the first backward,
reduce-overhead runs a new shape once in eager and records its CUDA graph the next time,
cuDNN builds an execution plan for its attention, cuBLAS picks kernels, the allocator grows.
Padded batches come in a dozen or more shapes per epoch (one per bucketed width, and the
epoch's last, smaller batch), and the timed window would otherwise meet some for the first
time. So warm-up runs one step on a batch of every distinct shape the sampler will produce
(`data.batching.distinct_batch_shapes`), pass after pass until a whole pass compiles and
records nothing (eager: one pass; compiled: two; CUDA graphs: three), then the requested
steps on real batches, which warm the data pipeline too. The timed window is still checked:
a compile event inside it has it timed again (`measure.loop`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from autotune.config import IGNORE_INDEX
from autotune.measure.compile_events import CompileEvents

MAX_SHAPE_PASSES = 4  # passes over the shapes: CUDA graphs settle on the third; one spare


@dataclass
class WarmUp:
    """What warm-up did: steps per pass over the shapes, then on real data."""

    shape_passes: list[list[float]] = field(default_factory=list)  # step times, one list per pass
    data_steps: list[float] = field(default_factory=list)
    quiet: bool = True  # the last pass over the shapes compiled and recorded nothing

    @property
    def shape_steps(self) -> int:
        return sum(len(p) for p in self.shape_passes)

    def compile_time(self, steady_step_s: float) -> float:
        """Time spent beyond steady steps: each shape's early passes against its last,
        quiet pass (a shape's own steady time: shapes differ in size by design), and real
        warm-up steps against the steady step of the timed window."""
        extra = sum(max(0.0, t - steady_step_s) for t in self.data_steps)
        if not self.shape_passes:
            return extra
        last = self.shape_passes[-1] if self.quiet else [steady_step_s] * len(self.shape_passes[0])
        for earlier in self.shape_passes[:-1] if self.quiet else self.shape_passes:
            extra += sum(max(0.0, t - steady) for t, steady in zip(earlier, last))
        return extra


def synthetic_batch(
    shape: tuple[int, int], vocab_size: int, generator: torch.Generator, *, documents: bool = False
) -> tuple[torch.Tensor, ...]:
    """A (B, T) batch of random tokens, every label real: the shape is what matters here.
    With `documents`, int32 document ids as packed windows carry them: two documents a row,
    so the document-masked graph is the one warmed."""
    input_ids = torch.randint(0, vocab_size, shape, generator=generator)
    labels = torch.randint(0, vocab_size, shape, generator=generator)
    labels[:, -1] = IGNORE_INDEX  # as a padded batch ends: the ignore path is warm too
    if not documents:
        return input_ids, labels
    document_ids = (torch.arange(shape[1]) >= shape[1] // 2).to(torch.int32).expand(shape).contiguous()
    return input_ids, labels, document_ids


def warm_up(
    step: Callable[..., torch.Tensor],
    batches: Iterator[tuple[torch.Tensor, ...]],
    *,
    shapes: list[tuple[int, int]] | None,
    documents: bool = False,
    vocab_size: int,
    data_steps: int,
    sync: Callable[[], None],
    events: CompileEvents,
    seed: int = 0,
    accumulation_steps: int = 1,
    agree: Callable[[bool], bool] | None = None,
) -> WarmUp:
    """Every shape until a pass is quiet (see the module docstring), then `data_steps` real
    batches, and more until the steps so far make whole optimizer steps (`accumulation_steps`
    micro-steps each), so the timed window starts at an optimizer-step boundary; each step
    synchronized and timed. `agree`: over several ranks, whether every rank's pass was quiet
    (they take the same number of steps: each step's collectives are every rank's)."""
    result = WarmUp()
    generator = torch.Generator().manual_seed(seed)
    batches_of_shapes = [synthetic_batch(shape, vocab_size, generator, documents=documents) for shape in shapes or ()]
    for _ in range(MAX_SHAPE_PASSES if batches_of_shapes else 0):
        before = events.total
        result.shape_passes.append([_timed_step(step, sync, *batch) for batch in batches_of_shapes])
        result.quiet = events.total == before if agree is None else agree(events.total == before)
        if result.quiet:
            break
    whole = -(-(result.shape_steps + data_steps) // accumulation_steps) * accumulation_steps
    for _ in range(whole - result.shape_steps):
        batch = next(batches)  # (input_ids, labels), and document_ids under a document mask
        result.data_steps.append(_timed_step(step, sync, *batch))
    return result


def _timed_step(step, sync: Callable[[], None], *batch: torch.Tensor) -> float:
    t = time.perf_counter()
    step(*batch)
    sync()
    return time.perf_counter() - t
