"""Peak memory by phase of a measurement: warm-up, the extreme shapes, the timed window.

A run's worst case is the maximum over its phases; the window's own peak is kept beside it,
so a recipe shows how far the worst case is above what steady training draws. Each phase is
read, then the meter restarts, so the next reading is that phase's alone:

    CPU   the process tree's memory (`device.ProcessTreeMemory`): the root's VmHWM is reset
          through /proc/PID/clear_refs, the samples of its DataLoader workers restart;
    CUDA  NVML's figure (sampled: the caching allocator keeps what it reserved, so a phase
          after a larger one reads at least the memory still held), and torch's allocated
          and reserved peaks (reset_peak_memory_stats: exact per phase).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autotune.device import ProcessTreeMemory
from autotune.measure.cuda import RSS, CudaSession, HostSession


@dataclass(frozen=True)
class PeakReading:
    """One phase's peaks: the figure the limit is judged on, and torch's own on CUDA."""

    bytes: int | None
    source: str | None
    allocated: int | None = None  # torch.cuda.max_memory_allocated: live tensors
    reserved: int | None = None  # torch.cuda.max_memory_reserved: the allocator's segments


class MemoryMeter(Protocol):
    def read(self) -> PeakReading: ...
    def restart(self) -> None: ...


class HostMeter:
    """A CPU run's memory: its process tree's (the run, its DataLoader workers)."""

    def __init__(self, host: ProcessTreeMemory) -> None:
        self.host = host

    def read(self) -> PeakReading:
        return PeakReading(self.host.peak_bytes, RSS)

    def restart(self) -> None:
        self.host.restart_peak()


class CudaMeter:
    def __init__(self, session: CudaSession) -> None:
        self.session = session

    def read(self) -> PeakReading:
        peak, source, allocated = self.session.peak_memory()
        return PeakReading(peak, source, allocated, self.session.reserved_peak())

    def restart(self) -> None:
        self.session.restart_peak()


def memory_meter(session: CudaSession | HostSession, host: ProcessTreeMemory) -> MemoryMeter:
    return CudaMeter(session) if isinstance(session, CudaSession) else HostMeter(host)


@dataclass
class PhasePeaks:
    """The peak of each phase, read in order (`close(phase)` reads it and restarts the meter)."""

    meter: MemoryMeter
    phases: dict[str, PeakReading | None]

    @classmethod
    def start(cls, meter: MemoryMeter) -> "PhasePeaks":
        return cls(meter, {})

    def close(self, phase: str) -> PeakReading:
        reading = self.meter.read()
        self.phases[phase] = reading
        self.meter.restart()
        return reading

    def worst(self) -> PeakReading:
        """The maximum over the phases (by the judged figure; torch's peaks by their own)."""
        readings = [r for r in self.phases.values() if r is not None]
        judged = max((r for r in readings if r.bytes is not None), key=lambda r: r.bytes, default=None)
        return PeakReading(
            judged.bytes if judged else None,
            judged.source if judged else None,
            _max(r.allocated for r in readings),
            _max(r.reserved for r in readings),
        )

    def bytes_of(self, phase: str) -> int | None:
        reading = self.phases.get(phase)
        return reading.bytes if reading is not None else None


def _max(values) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
