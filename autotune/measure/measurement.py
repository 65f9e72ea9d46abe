"""`Measurement`: what one run measured, as one typed value from the trial process to the
study, the summary and the recipe. This module imports no torch (a study is read without it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass
class Measurement:
    """What one run measured. Field names are the `--json` keys of `bench`."""

    config: dict[str, Any]
    outcome: str
    reason: str | None = None
    tokens_per_sec: float | None = None  # effective: non-pad tokens / wall time
    # 95 % interval [low, high] of tokens_per_sec from the step times (`measure.intervals`);
    # null when the window has too few effective samples
    tokens_per_sec_ci95: list[float] | None = None
    padded_tokens_per_sec: float | None = None  # every position computed, pads included
    padded_tokens_per_sec_ci95: list[float] | None = None
    padding_fraction: float | None = None
    step_time_median_s: float | None = None  # of one (micro-)step: one token-budget batch's forward and backward
    step_time_cv: float | None = None
    data_wait_fraction: float | None = None  # share of the timed window blocked on the next batch
    compile_time_s: float | None = None
    mfu: float | None = None  # at the mean padded width; null where the peak FLOPs are unknown (CPUs, MIG)
    mfu_at_context: float | None = None  # the same throughput with attention over the full context
    # MFU (at the mean padded width) against what a large matmul was measured to reach on this
    # card (device.flops.MEASURED_PEAK_FLOPS: 790 TFLOP/s bf16 on an H200, of the datasheet's
    # 989), not the datasheet; null where no such measurement is known
    mfu_measured_peak: float | None = None
    peak_memory_bytes: int | None = None
    # nvml-process: NVML's figure for this PID; nvml-device: the device's used memory minus a
    # baseline read before CUDA started (containers, where NVML reports host PIDs);
    # allocator-reserved: torch's reserved peak (no NVML; misses the CUDA context); rss: the
    # process tree's, on CPU
    peak_memory_source: str | None = None
    allocator_peak_bytes: int | None = None  # torch's max_memory_allocated (CUDA)
    allocator_reserved_peak_bytes: int | None = None  # torch's max_memory_reserved (CUDA): the cache's segments
    # peak_memory_bytes is the worst case: the maximum over warm-up, the extreme shapes and the
    # timed window (`measure.extremes`); the window's own peak, what steady steps drew, is this:
    window_peak_memory_bytes: int | None = None
    extremes_peak_memory_bytes: int | None = None  # the steps on the extreme shapes alone
    extreme_shapes: list[list[int]] = field(default_factory=list)  # [batch size, width] each, run before the window
    extreme_steps: int = 0  # steps run on them (whole optimizer steps: cycled under accumulation)
    extremes_note: str | None = None  # why no extreme step ran (one batch shape: the window runs it)
    # Host memory of the whole process tree (the run, its DataLoader workers and their
    # children), sampled: on CPU it is peak_memory_bytes; on CUDA it is reported beside it.
    host_peak_memory_bytes: int | None = None
    gpu_utilization: float | None = None  # mean NVML utilization over the timed steps, 0..1
    # Energy of the timed window (`measure.energy`): joules per effective token, from NVML's
    # counter on CUDA or RAPL on a CPU; null with energy_note saying why where neither is read
    energy_joules: float | None = None
    joules_per_token: float | None = None
    energy_source: str | None = None  # nvml-device, rapl-package: whole-device counters
    energy_note: str | None = None
    unstable: bool = False
    # The search asked to stop early below a threshold (its best less a margin), and this run's
    # short first window was clearly below it: its figures are that window's (search.planner).
    short_window: bool = False
    steps: int = 0  # timed steps: micro-steps, under gradient accumulation
    # DataLoader epochs begun inside the timed window(s): each starts non-persistent workers
    # anew. The data is sized so a first window needs none (0 but for a window re-timed long).
    epochs_during_timing: int = 0
    accumulation_steps: int = 1  # micro-steps per optimizer step
    optimizer_steps: int | None = None  # in the timed window (steps // accumulation_steps)
    global_batch_tokens: int | None = None  # positions per optimizer step the run fixed; None: token_budget
    warmup_steps: int = 0  # steps on real data before timing
    shape_warmup_steps: int = 0  # steps on a batch of each distinct shape, before those
    recompiles_during_timing: int = 0  # compile events in the kept window: compiles, recompiles, CUDA graph recordings
    retimed_windows: int = 0  # windows timed again because something was compiled or recorded in them
    final_loss: float | None = None
    model: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)  # setup, warmup, timed, total
    # A generation run's own figures (`measure.generation.GenerationFigures`: time to first token
    # and per-token latency p50/p99, prefill tokens/s, the correctness check); None for training.
    # Its tokens_per_sec is output tokens/s at the batch.
    generation: dict[str, Any] | None = None
    # Several ranks (`--nproc-per-node N`, `trial.ranks`): absent from a single process's record.
    # tokens_per_sec is then global: every rank's real tokens over the slowest rank's window; mfu,
    # step times and peak memory are per device (the worst rank's peak: the limit is per device).
    world_size: int = 1
    per_device_tokens_per_sec: float | None = None  # tokens_per_sec / world_size
    straggler_ratio: float | None = None  # the slowest rank's window over the fastest's (1.0: none)
    # tokens_per_sec over world_size x the best single-rank configuration's (a reference trial
    # with one rank, measured by the search on the same host); None until one is measured
    scaling_efficiency: float | None = None
    # Each rank's own figures: rank, tokens, window_s, tokens_per_sec, data_wait_fraction,
    # peak_memory_bytes, step_time_median_s, mfu, ready_s (launch to the rank's entry: what a
    # rank costs to start), rendezvous_s (its init_process_group)
    ranks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tokens_per_joule(self) -> float | None:
        return 1.0 / self.joules_per_token if self.joules_per_token else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.world_size == 1:  # a single process's record reads as it always has
            for name in RANK_FIELDS:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measurement":
        """Read back a stored measurement; keys of other autotune versions are ignored."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @classmethod
    def failed(cls, config: Mapping[str, Any], outcome: str, reason: str | None, **context: Any) -> "Measurement":
        """A run that produced no figures: its outcome and why."""
        return cls(config=dict(config), outcome=outcome, reason=reason, **context)


# The figures of several ranks, left out of a single process's record.
RANK_FIELDS = ("world_size", "per_device_tokens_per_sec", "straggler_ratio", "scaling_efficiency", "ranks")
