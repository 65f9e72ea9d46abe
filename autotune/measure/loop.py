"""The one measuring loop: `bench`, every `search` trial and `verify` all run this.

Rules (gpt-fast / llm.c hygiene):
- build, then warm-up steps (compilation happens here; their extra time is reported apart
  as `compile_time_s`, never mixed into the throughput);
- timed steps bracketed by a device synchronize, so the clock reads finished work; on CUDA
  each step's end is a CUDA event, so steps are timed on the device without a sync per step
  that would stop the CPU from queueing ahead, as a real training loop does;
- every step is a real training step: forward, backward, AdamW (fused where available);
- effective tokens/s = non-pad target tokens / wall time of the timed window, data waits
  included; the median step time and its coefficient of variation give the spread;
- the window lasts at least `steps` steps and `min_time_s` seconds (2 s by default);
- a noisy run (CV above target) takes a second window of steps, then is flagged unstable.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from autotune.config import IGNORE_INDEX, RunSpec, TrainConfig
from autotune.data.batching import build_dataloader
from autotune.data.datasets import make_dataset
from autotune.device import DeviceInfo, GpuSampler, describe, peak_rss_bytes
from autotune.errors import UsageError
from autotune.knobs.apply import apply_model_knobs
from autotune.knobs.precision import grad_scaler
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.measure import outcomes
from autotune.measure.flops import model_flops_utilization
from autotune.measure.measurement import Measurement
from autotune.measure.step import endless_batches, make_optimizer, make_train_step
from autotune.model.introspect import model_shape, non_embedding_params
from autotune.model.load import build_model

CV_TARGET = 0.05  # above this, the run takes more samples, then is flagged unstable
MAX_STEPS_FACTOR = 50  # the minimum timed window stretches --steps at most this many times
MAX_SHAPE_WARMUP = 10  # extra warm-up steps allowed to let dynamo settle on dynamic shapes


def measure(spec: RunSpec, cfg: TrainConfig, device_info: DeviceInfo | None = None) -> Measurement:
    """Run `cfg` on `spec` and measure it. A configuration that fails (unsupported, out of
    memory, a crash inside torch) comes back as a Measurement with that outcome; bad input
    from the user (UsageError) is raised."""
    started = time.perf_counter()
    info = device_info or describe(spec.device)
    try:
        check_supported(cfg, DeviceCapabilities.detect(info.kind, info.capability_tuple))
        result = _Run(spec, cfg, info).execute()
    except UsageError:
        raise
    except Exception as exc:
        outcome, reason = outcomes.classify_exception(exc)
        result = Measurement.failed(cfg.to_dict(), outcome, reason, device=info.to_dict(), model={"name": spec.model})
        _release_memory(info)
    result.phase_s["total"] = time.perf_counter() - started
    return result


class _Run:
    """One measurement's state; `execute` reads top to bottom like a training script."""

    def __init__(self, spec: RunSpec, cfg: TrainConfig, info: DeviceInfo) -> None:
        self.spec, self.cfg, self.info = spec, cfg, info
        self.device = torch.device(spec.device)
        self.kind = info.kind
        self.phase: dict[str, float] = {}

    def execute(self) -> Measurement:
        t = time.perf_counter()
        self._prepare_device()
        model, seq_len = self._build_model()
        optimizer = make_optimizer(model, self.device)
        scaler = grad_scaler(self.kind, self.cfg.amp_dtype)
        dataset = make_dataset(self.spec.data, vocab_size=self.shape.vocab_size, seq_len=seq_len, seed=self.spec.seed)
        loader = build_dataloader(dataset, self.cfg, seq_len=seq_len, seed=self.spec.seed)
        batches = endless_batches(loader)
        step = make_train_step(model, optimizer, scaler, device=self.device, device_kind=self.kind, cfg=self.cfg)
        self.phase["setup"] = time.perf_counter() - t
        try:
            t = time.perf_counter()
            warm_times = self._warm_up(batches, step)
            self.phase["warmup"] = time.perf_counter() - t
            t = time.perf_counter()
            window = self._timed(batches, step)
            if window.cv > CV_TARGET:  # noisy: one more window of samples before judging
                window = window.merge(self._timed(batches, step))
            self.phase["timed"] = time.perf_counter() - t
        finally:
            batches.close()  # shuts DataLoader workers down now, not at garbage collection
        return self._result(model, window, warm_times)

    # --- set-up ---------------------------------------------------------------------------

    def _prepare_device(self) -> None:
        torch.manual_seed(self.spec.seed)
        if self.kind != "cuda":
            return
        torch.cuda.set_device(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        limit, total = self.spec.memory_limit_bytes, self.info.total_memory_bytes
        if limit and total:
            # Make the allocator refuse to grow past the limit: an over-limit configuration
            # fails fast as `oom` instead of taking the whole card from other processes.
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), self.device)

    def _build_model(self) -> tuple[nn.Module, int]:
        model = build_model(self.spec.model)
        self.shape = model_shape(model, self.spec.seq_len)
        if self.spec.seq_len and self.spec.seq_len > (getattr(model, "context_length", None) or self.spec.seq_len):
            raise UsageError(f"--seq-len {self.spec.seq_len} is longer than the model's context {model.context_length}")
        self.n_params = non_embedding_params(model)
        model.to(self.device).train()
        apply_model_knobs(model, self.cfg)
        return model, self.shape.context_length

    # --- the steps ------------------------------------------------------------------------

    def _warm_up(self, batches: Iterator, step: Callable) -> list[float]:
        """Warm-up steps, each synchronized and timed. With compile and padded batches,
        keep going until two widths were seen: dynamo then marks the length dynamic and
        stops recompiling, so no compilation lands in the timed steps."""
        times: list[float] = []
        widths: set[int] = set()
        need_shapes = self.cfg.compile_mode != "none" and self.cfg.batching == "padded"
        while len(times) < self.spec.warmup or (
            need_shapes and len(widths) < 2 and len(times) < self.spec.warmup + MAX_SHAPE_WARMUP
        ):
            x, y, *documents = next(batches)  # packed documents add document_ids
            widths.add(x.shape[1])
            t = time.perf_counter()
            step(x, y, *documents)
            self._sync()
            times.append(time.perf_counter() - t)
        return times

    def _timed(self, batches: Iterator, step: Callable) -> "_Window":
        window = _Window()
        clock = _StepClock(self.kind)
        graphs_before = _compiled_graphs()
        with GpuSampler(self.info.uuid if self.kind == "cuda" else None) as sampler:
            self._sync()
            start = time.perf_counter()
            clock.mark()
            while len(window.widths) < self.spec.steps or (
                time.perf_counter() - start < self.spec.min_time_s
                and len(window.widths) < MAX_STEPS_FACTOR * self.spec.steps
            ):
                t = time.perf_counter()
                x, y, *documents = next(batches)  # packed documents add document_ids
                window.wait_s += time.perf_counter() - t
                window.tokens += int((y != IGNORE_INDEX).sum())  # on the host: no device sync
                window.positions += y.numel()
                window.widths.append(y.shape[1])
                window.positions_per_step.append(y.numel())
                loss = step(x, y, *documents)
                clock.mark()
            self._sync()
            window.wall_s = time.perf_counter() - start
        window.step_times = clock.durations()
        window.recompiles = _compiled_graphs() - graphs_before
        window.gpu_utilization = sampler.mean_utilization
        window.nvml_peak = sampler.peak_process_memory
        window.final_loss = float(loss.detach())
        return window

    def _sync(self) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize(self.device)

    # --- figures --------------------------------------------------------------------------

    def _result(self, model: nn.Module, window: "_Window", warm_times: list[float]) -> Measurement:
        median = statistics.median(window.step_times)
        tokens_per_sec = window.tokens / window.wall_s
        peak, source, allocator_peak = self._peak_memory(window)
        compile_time = 0.0
        if self.cfg.compile_mode != "none":
            compile_time = sum(max(0.0, w - median) for w in warm_times)
        outcome, reason = outcomes.decide_measured(peak, self.spec.memory_limit_bytes)
        return Measurement(
            config=self.cfg.to_dict(),
            outcome=outcome,
            reason=reason,
            tokens_per_sec=tokens_per_sec,
            padded_tokens_per_sec=window.positions / window.wall_s,
            padding_fraction=1.0 - window.tokens / window.positions,
            step_time_median_s=median,
            step_time_cv=window.cv,
            data_wait_fraction=window.wait_s / window.wall_s,
            compile_time_s=compile_time,
            mfu=model_flops_utilization(
                tokens_per_sec,
                n_params=self.n_params,
                shape=self.shape,
                width=statistics.fmean(window.widths),
                device=self.info,
                amp_dtype=self.cfg.amp_dtype,
            ),
            peak_memory_bytes=peak,
            peak_memory_source=source,
            allocator_peak_bytes=allocator_peak,
            gpu_utilization=window.gpu_utilization,
            unstable=window.cv > CV_TARGET,
            steps=len(window.step_times),
            warmup_steps=len(warm_times),
            recompiles_during_timing=window.recompiles,
            final_loss=window.final_loss,
            model={
                "name": self.spec.model,
                "non_embedding_params": self.n_params,
                "seq_len": self.shape.context_length,
                "n_layer": self.shape.n_layer,
                "vocab_size": self.shape.vocab_size,
            },
            device=self.info.to_dict(),
            phase_s=dict(self.phase),
        )

    def _peak_memory(self, window: "_Window") -> tuple[int, str, int | None]:
        if self.kind != "cuda":
            return peak_rss_bytes(), "rss", None
        allocator_peak = int(torch.cuda.max_memory_allocated(self.device))
        if window.nvml_peak is not None:
            return window.nvml_peak, "nvml-process", allocator_peak
        return int(torch.cuda.max_memory_reserved(self.device)), "allocator-reserved", allocator_peak


@dataclass
class _Window:
    """The figures of one timed window of steps."""

    wall_s: float = 0.0
    wait_s: float = 0.0
    tokens: int = 0
    positions: int = 0
    widths: list[int] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    recompiles: int = 0
    gpu_utilization: float | None = None
    nvml_peak: int | None = None
    final_loss: float | None = None

    positions_per_step: list[int] = field(default_factory=list)

    @property
    def cv(self) -> float:
        """Coefficient of variation of the time per computed position. Length-grouped
        batches differ in shape, so raw step times vary by design; normalizing by each
        step's positions leaves the noise (for fixed shapes it equals the step-time CV)."""
        if len(self.step_times) < 2:
            return 0.0
        per_position = [t / n for t, n in zip(self.step_times, self.positions_per_step)]
        mean = statistics.fmean(per_position)
        return statistics.stdev(per_position) / mean if mean > 0 else 0.0

    def merge(self, other: "_Window") -> "_Window":
        util = [u for u in (self.gpu_utilization, other.gpu_utilization) if u is not None]
        peaks = [p for p in (self.nvml_peak, other.nvml_peak) if p is not None]
        return _Window(
            wall_s=self.wall_s + other.wall_s,
            wait_s=self.wait_s + other.wait_s,
            tokens=self.tokens + other.tokens,
            positions=self.positions + other.positions,
            widths=self.widths + other.widths,
            positions_per_step=self.positions_per_step + other.positions_per_step,
            step_times=self.step_times + other.step_times,
            recompiles=self.recompiles + other.recompiles,
            gpu_utilization=statistics.fmean(util) if util else None,
            nvml_peak=max(peaks) if peaks else None,
            final_loss=other.final_loss,
        )


class _StepClock:
    """Step boundaries: host clock on CPU (work there is synchronous), CUDA events on GPU
    (timestamps taken on the device's own timeline, read after one final synchronize)."""

    def __init__(self, kind: str) -> None:
        self.cuda = kind == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def durations(self) -> list[float]:
        pairs = zip(self.marks, self.marks[1:])
        if self.cuda:
            return [a.elapsed_time(b) / 1000.0 for a, b in pairs]
        return [b - a for a, b in pairs]


def _compiled_graphs() -> int:
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # a torch without dynamo: nothing is ever compiled
        return 0
    return int(counters["stats"]["unique_graphs"])


def _release_memory(info: DeviceInfo) -> None:
    if info.kind == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
