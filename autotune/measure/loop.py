"""The one measuring loop: `bench`, every `search` trial and `verify` all run this.

Rules (gpt-fast / llm.c hygiene):
- build, then warm-up (`measure.warmup`): one step on a batch of every distinct shape the
  sampler will produce, pass after pass until nothing compiles or records, then the
  requested steps on real data; their extra time is reported apart as `compile_time_s`,
  never mixed into the throughput;
- TF32, when asked for, is on for the whole run: forward, backward, optimizer and the
  kernels compiled meanwhile (`knobs.precision.fp32_precision`);
- timed steps bracketed by a device synchronize, so the clock reads finished work; on CUDA
  each step's end is a CUDA event, so steps are timed on the device without a sync per step
  that would stop the CPU from queueing ahead, as a real training loop does;
- a window in which anything was compiled or a CUDA graph recorded is timed again
  (`recompiles_during_timing` counts what the kept window still had, `retimed_windows`
  how many were dropped);
- every step is a real training step: forward, backward, AdamW (fused where available);
- effective tokens/s = non-pad target tokens / wall time of the timed window, data waits
  included; the median step time and its coefficient of variation give the spread;
- the window lasts at least `steps` steps and `min_time_s` seconds (2 s by default);
- with a global batch (`RunSpec.global_batch_tokens`), a step is a micro-step: each one
  forward and backward on one token-budget micro-batch, and every `accumulation_steps`-th
  also the optimizer step. Warm-up ends and the timed window starts and ends at an
  optimizer-step boundary, so the window holds whole optimizer steps and tokens/s (all
  micro-steps' real tokens over the window's wall time) carries the optimizer's cost in its
  true proportion. The median step time is a micro-step's; the CV leaves out the
  optimizer-bearing micro-steps, longer by design (with at least two others to compare);
- a noisy run (CV above target) takes a second window of steps, then is flagged unstable;
- between warm-up and the window, one step on each extreme batch shape the sampler can
  produce (`measure.extremes`): peak memory is the worst case over warm-up, those steps and
  the window, each phase read apart (`measure.peaks`); the window's own peak is kept beside it.
The CUDA side (device, memory baseline and cap, events, peak memory) is `measure.cuda`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from autotune.config import IGNORE_INDEX, RunSpec, TrainConfig
from autotune.data.batching import carries_document_ids, distinct_batch_shapes
from autotune.device import DeviceInfo, ProcessTreeMemory, cuda_index, describe
from autotune.errors import UsageError
from autotune.knobs.precision import fp32_precision
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.measure import intervals, outcomes
from autotune.measure.compile_events import CompileEvents
from autotune.measure.cuda import CudaSession, HostSession, session_for
from autotune.measure.energy import EnergyMeter, energy_meter, joules_per_token, window_energy
from autotune.measure.extremes import Extremes, extreme_shapes, run_extremes
from autotune.measure.flops import model_flops_utilization, step_work
from autotune.measure.measurement import Measurement
from autotune.measure.peaks import PhasePeaks, memory_meter
from autotune.measure.ranks import Ranks
from autotune.measure.setup import set_up_training
from autotune.measure.warmup import WarmUp

SHORT_SHARE = 0.25  # a pruning trial's first window: this share of the steps and minimum time
CV_TARGET = 0.05  # above this, the run takes more samples, then is flagged unstable
MAX_STEPS_FACTOR = 50  # the minimum timed window stretches --steps at most this many times
MAX_RETIMES = 3  # windows dropped for a compile event in them before the last one is kept, flagged


def measure(spec: RunSpec, cfg: TrainConfig, device_info: DeviceInfo | None = None) -> Measurement:
    """Run `cfg` on `spec` and measure it. A configuration that fails (unsupported, out of
    memory, a crash inside torch) comes back as a Measurement with that outcome; bad input
    from the user (UsageError) is raised."""
    return measured_run(
        spec.device,
        spec.memory_limit_bytes,
        spec.model,
        cfg,
        device_info,
        lambda info, session, host: _Run(spec, cfg, info, session, host).execute(),
    )


Run = Callable[[DeviceInfo, "CudaSession | HostSession", ProcessTreeMemory], Measurement]


def measured_run(
    device: str, memory_limit_bytes: int | None, model: str, cfg: Any, device_info: DeviceInfo | None, run: Run
) -> Measurement:
    """`run(info, session, host)` on `device` (the training loop's, or generation's:
    `measure.generation`), after the device's rules for `cfg`, with the process tree's memory
    watched; a failure comes back as a Measurement of its outcome, bad input (UsageError) is raised."""
    started = time.perf_counter()
    device = measured_device(device)
    info = device_info or describe(device)
    session = session_for(device, info, memory_limit_bytes)
    try:
        check_supported(cfg, DeviceCapabilities.detect(info.kind, info.capability_tuple))
        with ProcessTreeMemory() as host:  # this process, its DataLoader workers and their children
            result = run(info, session, host)
    except UsageError:
        raise
    except Exception as exc:
        outcome, reason = outcomes.classify_exception(exc)
        result = Measurement.failed(cfg.to_dict(), outcome, reason, device=info.to_dict(), model={"name": model})
        session.release()
    result.phase_s["total"] = time.perf_counter() - started
    return result


def measured_device(device: str) -> str:
    """`cpu`, or `cuda:N` with its index (`cuda` alone is the device a fresh process starts
    on, 0): the torch.cuda calls of a measurement need the index."""
    return "cpu" if device == "cpu" else f"cuda:{cuda_index(device)}"


class _Run:
    """One measurement's state; `execute` reads top to bottom like a training script."""

    def __init__(
        self,
        spec: RunSpec,
        cfg: TrainConfig,
        info: DeviceInfo,
        session: CudaSession | HostSession,
        host: ProcessTreeMemory,
    ) -> None:
        self.spec, self.cfg, self.info, self.session, self.host = spec, cfg, info, session, host
        self.device = session.device
        self.kind = info.kind
        self.phase: dict[str, float] = {}
        self.events = CompileEvents()
        self.energy: EnergyMeter = energy_meter(info.kind, info.uuid)
        # Micro-batches per optimizer step; a token budget that does not divide the global
        # batch is UnsupportedConfig before anything is built.
        self.accumulation = spec.accumulation_steps(cfg)
        self.peaks = PhasePeaks.start(memory_meter(session, host))
        # Alone, or one of the ranks of a launch (`measure.ranks`: what they decide together).
        self.ranks = Ranks(self.device)

    def execute(self) -> Measurement:
        with fp32_precision(self.cfg.amp_dtype), self.events:
            t = time.perf_counter()
            torch.manual_seed(self.spec.seed)
            self.session.start()
            # Data for warm-up and the longest first window in one epoch: no new epoch (workers
            # started anew, unless persistent) inside the window, as in a run over a real corpus.
            data_steps = self.spec.warmup + MAX_STEPS_FACTOR * self.spec.steps + self.accumulation
            run = set_up_training(
                self.spec,
                self.cfg,
                device=self.device,
                device_kind=self.kind,
                data_steps=data_steps,
                rank=self.ranks.rank,
            )
            self.shape, self.n_params = run.shape, run.n_params
            self.phase["setup"] = time.perf_counter() - t
            try:
                t = time.perf_counter()
                warm = run.warm_up(self.spec, sync=self.session.sync, events=self.events, agree=self.ranks.all)
                self.session.after_warm_up()
                self.peaks.close("warmup")
                self.extremes = self._run_extremes(run.step, run.loader)
                self.phase["warmup"] = time.perf_counter() - t
                t = time.perf_counter()
                window = self._window(run)
                self.phase["timed"] = time.perf_counter() - t
                self.peaks.close("window")
            finally:
                run.close()  # shuts DataLoader workers down now, not at garbage collection
            return self._result(run.model, window, warm)

    # --- the steps ------------------------------------------------------------------------

    def _window(self, run) -> "_Window":
        """The timed steps. With a threshold to prune below (the search's best, less a margin), a
        short window first: clearly below it, beyond its 95 % interval, and the run is not timed in
        full (`short_window`); otherwise the rest of the window follows, merged with it."""
        # Several ranks are timed in full: a short window's verdict would be each rank's own.
        threshold = self.spec.prune_below_tokens_per_sec if self.ranks.alone else None
        if threshold is not None:
            first = self._clean_window(run.batches, run.step, SHORT_SHARE)
            high = self._interval_high(first)
            if high is not None and high < threshold:
                first.short = True
                return first
            window = first.merge(self._clean_window(run.batches, run.step, 1.0 - SHORT_SHARE))
        else:
            window = self._clean_window(run.batches, run.step)
        if self.ranks.any(window.cv > CV_TARGET):  # noisy: one more window of samples before judging
            window = window.merge(self._clean_window(run.batches, run.step))
        return window

    def _interval_high(self, window: "_Window") -> float | None:
        rate = window.tokens / window.wall_s
        times, work = window.step_times, window.work_per_step
        interval = intervals.rate_interval(rate, times, work, accumulation=self.accumulation)
        if interval is not None:
            return interval[1]
        # Too few effective samples for the interval (autocorrelated steps): twice the window's spread.
        return rate * (1 + 2 * max(window.cv, CV_TARGET)) if len(times) >= 2 else None

    def _run_extremes(self, step: Callable, loader: DataLoader) -> Extremes:
        """One step on each extreme shape, its peak read apart (`measure.extremes`)."""
        extremes = extreme_shapes(distinct_batch_shapes(loader))
        self.extreme_steps = run_extremes(
            step,
            extremes,
            vocab_size=self.shape.vocab_size,
            documents=carries_document_ids(loader),
            sync=self.session.sync,
            seed=self.spec.seed,
            accumulation_steps=self.accumulation,
        )
        self.peaks.close("extremes")
        return extremes

    def _clean_window(self, batches: Iterator, step: Callable, share: float = 1.0) -> "_Window":
        """A timed window in which nothing was compiled or recorded: one with a compile
        event is timed again, up to MAX_RETIMES times (the last one is kept, and flagged
        by its `recompiles`)."""
        window = self._timed(batches, step, share)
        dropped = 0
        while self.ranks.any(window.recompiles > 0) and dropped < MAX_RETIMES:
            dropped += 1
            window = self._timed(batches, step, share)
        window.retimed = dropped
        return window

    def _timed(self, batches: Iterator, step: Callable, share: float = 1.0) -> "_Window":
        """One timed window of at least `share` of the run's steps and minimum time."""
        steps = max(2, round(share * self.spec.steps))
        min_time = share * self.spec.min_time_s
        window = _Window(accumulation=self.accumulation)
        clock = self.session.clock()
        events_before, epochs_before = self.events.total, batches.epochs
        with self.session.sampler() as sampler:
            self.session.sync()
            self.ranks.barrier()  # several ranks start the window together
            energy_start = self.energy.start()  # after the synchronize: the window's work only
            start = time.perf_counter()
            clock.mark()

            def more() -> bool:
                done = len(window.widths)
                if done < steps or done % self.accumulation:  # whole optimizer steps only
                    return True
                # each rank reads its own clock: they stop together, when any still wants more
                return self.ranks.any(time.perf_counter() - start < min_time and done < MAX_STEPS_FACTOR * steps)

            while more():
                t = time.perf_counter()
                x, y, *documents = next(batches)  # packed documents add document_ids
                window.wait_s += time.perf_counter() - t
                window.tokens += int((y != IGNORE_INDEX).sum())  # on the host: no device sync
                window.positions += y.numel()
                window.widths.append(y.shape[1])
                window.work_per_step.append(self._step_work(y))
                loss = step(x, y, *documents)
                clock.mark()
            self.session.sync()
            window.wall_s = time.perf_counter() - start  # this rank's own window
            window.energy_j = self.energy.joules_since(energy_start)
            self.ranks.barrier()  # no rank starts what follows before the slowest has finished
        window.step_times = clock.durations()
        window.recompiles = self.events.total - events_before
        window.epochs = batches.epochs - epochs_before
        window.gpu_utilization = sampler.mean_utilization
        window.final_loss = float(loss.detach())
        return window

    def _step_work(self, labels: torch.Tensor) -> float:
        return step_work(self.n_params, self.shape, labels.shape[0], labels.shape[1])

    # --- figures --------------------------------------------------------------------------

    def _result(self, model: nn.Module, window: "_Window", warm: WarmUp) -> Measurement:
        median = statistics.median(window.step_times)
        tokens_per_sec = window.tokens / window.wall_s
        worst = self.peaks.worst()  # over warm-up, the extreme shapes and the window
        peak, source = worst.bytes, worst.source
        compile_time = warm.compile_time(median) if self.cfg.compile_mode != "none" else 0.0
        interval = intervals.rate_interval(
            tokens_per_sec, window.step_times, window.work_per_step, accumulation=self.accumulation
        )
        outcome, reason = outcomes.decide_measured(
            peak, self.spec.memory_limit_bytes, final_loss=window.final_loss, headroom=self.spec.memory_headroom
        )

        energy_j, energy_note = window_energy(self.energy, window.energy_j, window.wall_s)

        def mfu(width: float, measured: bool = False) -> float | None:
            return model_flops_utilization(
                tokens_per_sec,
                n_params=self.n_params,
                shape=self.shape,
                width=width,
                device=self.info,
                amp_dtype=self.cfg.amp_dtype,
                measured=measured,
            )

        measurement = Measurement(
            config=self.cfg.to_dict(),
            outcome=outcome,
            reason=reason,
            tokens_per_sec=tokens_per_sec,
            tokens_per_sec_ci95=list(interval) if interval else None,
            padded_tokens_per_sec=window.positions / window.wall_s,
            padded_tokens_per_sec_ci95=intervals.scaled(interval, window.positions / max(window.tokens, 1)),
            padding_fraction=1.0 - window.tokens / window.positions,
            step_time_median_s=median,
            step_time_cv=window.cv,
            data_wait_fraction=window.wait_s / window.wall_s,
            compile_time_s=compile_time,
            mfu=mfu(statistics.fmean(window.widths)),
            mfu_at_context=mfu(self.shape.context_length),
            mfu_measured_peak=mfu(statistics.fmean(window.widths), measured=True),
            epochs_during_timing=window.epochs,
            peak_memory_bytes=peak,
            peak_memory_source=source,
            allocator_peak_bytes=worst.allocated,
            allocator_reserved_peak_bytes=worst.reserved,
            window_peak_memory_bytes=self.peaks.bytes_of("window"),
            extremes_peak_memory_bytes=self.peaks.bytes_of("extremes") if self.extremes.shapes else None,
            extreme_shapes=[list(s) for s in self.extremes.shapes],
            extreme_steps=self.extreme_steps,
            extremes_note=self.extremes.note,
            # on a CPU the tree is the device (restarted per phase): its worst case is `peak`
            host_peak_memory_bytes=self.host.peak_bytes if self.kind == "cuda" else peak,
            gpu_utilization=window.gpu_utilization,
            energy_joules=energy_j,
            joules_per_token=joules_per_token(energy_j, window.tokens),
            energy_source=self.energy.source if energy_j is not None else None,
            energy_note=energy_note,
            unstable=window.cv > CV_TARGET,
            short_window=window.short,
            steps=len(window.step_times),
            accumulation_steps=self.accumulation,
            optimizer_steps=len(window.step_times) // self.accumulation,
            global_batch_tokens=self.spec.global_batch_tokens,
            warmup_steps=len(warm.data_steps),
            shape_warmup_steps=warm.shape_steps,
            recompiles_during_timing=window.recompiles,
            retimed_windows=window.retimed,
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
        if not self.ranks.alone:  # this rank's own figures, for `trial.ranks` to aggregate
            measurement.world_size = self.ranks.world
            measurement.ranks = [
                {
                    "rank": self.ranks.rank,
                    "tokens": window.tokens,
                    "positions": window.positions,
                    "window_s": window.wall_s,
                    "tokens_per_sec": tokens_per_sec,
                    "data_wait_fraction": measurement.data_wait_fraction,
                    "peak_memory_bytes": peak,
                    "step_time_median_s": median,
                    "mfu": measurement.mfu,
                    "threads": torch.get_num_threads(),  # OMP_NUM_THREADS: the host's CPUs // ranks
                }
            ]
        return measurement


@dataclass
class _Window:
    """The figures of one timed window of steps."""

    wall_s: float = 0.0
    wait_s: float = 0.0
    tokens: int = 0
    positions: int = 0
    widths: list[int] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    recompiles: int = 0  # compile events (compiles, recompiles, CUDA graph recordings) inside it
    retimed: int = 0  # windows dropped before this one for a compile event in them
    epochs: int = 0  # DataLoader epochs begun inside it (non-persistent workers start anew)
    gpu_utilization: float | None = None
    final_loss: float | None = None
    energy_j: float | None = None  # joules over the window; None without an energy counter
    short: bool = False  # stopped after a short window: clearly below the search's best

    work_per_step: list[float] = field(default_factory=list)  # modelled FLOPs of each step (see cv)
    accumulation: int = 1  # micro-steps per optimizer step; the window starts at a boundary

    @property
    def cv(self) -> float:
        """Coefficient of variation of the time per modelled FLOP. Length-grouped batches
        differ in shape, so raw step times vary by design, and not in proportion to their
        positions: attention's cost grows with the width. Normalising by each step's FLOPs
        (6N per position plus attention at its width) leaves the noise; for one shape it
        equals the step-time CV. Under accumulation, the micro-steps that end an optimizer
        step also run the optimizer, longer by design: they are left out when at least two
        others remain (every step is then alike)."""
        return intervals.time_per_flop_cv(self.step_times, self.work_per_step, self.accumulation)

    def merge(self, other: "_Window") -> "_Window":
        util = [u for u in (self.gpu_utilization, other.gpu_utilization) if u is not None]
        return _Window(
            wall_s=self.wall_s + other.wall_s,
            wait_s=self.wait_s + other.wait_s,
            tokens=self.tokens + other.tokens,
            positions=self.positions + other.positions,
            widths=self.widths + other.widths,
            work_per_step=self.work_per_step + other.work_per_step,
            step_times=self.step_times + other.step_times,
            recompiles=self.recompiles + other.recompiles,
            retimed=self.retimed + other.retimed,
            epochs=self.epochs + other.epochs,
            gpu_utilization=statistics.fmean(util) if util else None,
            final_loss=other.final_loss,
            energy_j=None if self.energy_j is None or other.energy_j is None else self.energy_j + other.energy_j,
            accumulation=self.accumulation,  # both windows hold whole optimizer steps
        )
