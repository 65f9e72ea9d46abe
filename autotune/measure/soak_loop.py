"""A soak run: the measuring loop's model, data and step, run long — one full epoch of the
data's batches (every batch shape at least once) or N steps — in windows, each with its
throughput and its own peak memory. It is what `autotune verify --soak` runs, in a fresh
process (`trial.__main__ --soak`); the verdict is `recipe.soak_check`'s. This module imports torch
(the `SoakRun` it returns is plain data)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import torch

from autotune.config import IGNORE_INDEX, RunSpec, TrainConfig
from autotune.data.batching import distinct_batch_shapes
from autotune.device import DeviceInfo, ProcessTreeMemory, describe
from autotune.errors import UsageError
from autotune.knobs.precision import fp32_precision
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.measure import outcomes
from autotune.measure.compile_events import CompileEvents
from autotune.measure.cuda import session_for
from autotune.measure.loop import measured_device
from autotune.measure.peaks import memory_meter
from autotune.measure.setup import set_up_training

SOAK_WINDOWS = 10  # throughput and memory are reported this many times over the run


@dataclass
class SoakWindow:
    end_step: int  # steps done at its end, counted from the first soak step
    steps: int
    seconds: float
    tokens_per_sec: float  # effective (non-pad) tokens over its wall time
    peak_memory_bytes: int | None  # its own peak (the meter restarts at each window)


@dataclass
class SoakRun:
    """What a soak run measured, or how it ended."""

    outcome: str
    reason: str | None = None
    steps: int = 0
    epoch_steps: int | None = None  # batches in one epoch of the data
    shapes_seen: int = 0  # distinct batch shapes stepped on
    shapes_total: int | None = None  # distinct batch shapes the sampler makes
    peak_memory_source: str | None = None
    windows: list[SoakWindow] = field(default_factory=list)
    device: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SoakRun":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["windows"] = [SoakWindow(**w) for w in known.get("windows", [])]
        return cls(**known)


def soak(spec: RunSpec, cfg: TrainConfig, steps: int | None, device_info: DeviceInfo | None = None) -> SoakRun:
    """Run `cfg` for `steps` steps (None: one epoch of the data's batches) after the loop's
    warm-up, in SOAK_WINDOWS windows. Failures come back as a SoakRun with their outcome."""
    device = measured_device(spec.device)
    info = device_info or describe(device)
    session = session_for(device, info, spec.memory_limit_bytes)
    try:
        check_supported(cfg, DeviceCapabilities.detect(info.kind, info.capability_tuple))
        with ProcessTreeMemory() as host:
            return _Soak(spec, cfg, info, session, host).soak(steps)
    except UsageError:
        raise
    except Exception as exc:
        session.release()
        return SoakRun(*outcomes.classify_exception(exc), device=info.to_dict())


class _Soak:
    """The measuring loop's set-up and warm-up (`measure.setup`), then the long run."""

    def __init__(self, spec: RunSpec, cfg: TrainConfig, info: DeviceInfo, session, host: ProcessTreeMemory) -> None:
        self.spec, self.cfg, self.info, self.session, self.host = spec, cfg, info, session, host
        self.meter = memory_meter(session, host)

    def soak(self, steps: int | None) -> SoakRun:
        with fp32_precision(self.cfg.amp_dtype), CompileEvents() as events:
            torch.manual_seed(self.spec.seed)
            self.session.start()
            run = set_up_training(self.spec, self.cfg, device=self.session.device, device_kind=self.info.kind)
            shapes = distinct_batch_shapes(run.loader)
            total = steps or len(run.loader)  # one epoch: every batch shape at least once
            total = -(-total // run.accumulation) * run.accumulation  # whole optimizer steps
            try:
                run.warm_up(self.spec, sync=self.session.sync, events=events)
                self.session.after_warm_up()
                self.meter.restart()
                soaked = SoakRun(
                    outcomes.OK,
                    steps=total,
                    epoch_steps=len(run.loader),
                    shapes_total=len(shapes) if shapes is not None else None,
                    device=self.info.to_dict(),
                )
                soaked.windows, seen = self._windows(run.batches, run.step, total)
                soaked.shapes_seen = len(seen)
                soaked.peak_memory_source = self.meter.read().source
            finally:
                run.close()
            return soaked

    def _windows(self, batches, step, total: int) -> tuple[list[SoakWindow], set[tuple[int, int]]]:
        bounds = sorted({round(total * (k + 1) / SOAK_WINDOWS) for k in range(SOAK_WINDOWS)} - {0})
        windows: list[SoakWindow] = []
        seen: set[tuple[int, int]] = set()
        done = 0
        for end in bounds:
            tokens, start = 0, time.perf_counter()
            for _ in range(end - done):
                x, y, *documents = next(batches)
                tokens += int((y != IGNORE_INDEX).sum())
                seen.add(tuple(y.shape))
                step(x, y, *documents)
            self.session.sync()
            seconds = time.perf_counter() - start
            peak = self.meter.read().bytes
            self.meter.restart()
            windows.append(SoakWindow(end, end - done, seconds, tokens / seconds if seconds > 0 else 0.0, peak))
            done = end
        return windows, seen
