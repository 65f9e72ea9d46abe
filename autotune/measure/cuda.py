"""The CUDA side of a measurement, in one place: choosing the device, the memory baseline
and the allocator's cap, synchronizing, timing steps with CUDA events, and the peak memory.
The measuring loop and the profiler use it; on a CPU they use `HostSession`, which has the
same methods and does the CPU's (nothing, the host clock, peak RSS).

Order matters at the start (`CudaSession.start`):
  1. CUDA_DEVICE_ORDER=PCI_BUS_ID, so cuda:N is the GPU NVML described (CUDA reads it once);
  2. the device's used memory through NVML, before this process has a CUDA context: the
     baseline of the container-safe figure (`device.gpu_memory`);
  3. torch.cuda.set_device(N), with the index: torch refuses torch.device("cuda") there;
  4. the allocator's cap, leaving room for the memory it does not manage (context, library
     handles, loaded kernels), measured now and again after warm-up (`cap_allocator`)."""

from __future__ import annotations

import time
from typing import Any

import torch

from autotune.device import DeviceInfo, GpuSampler, cuda_index, peak_rss_bytes, pin_cuda_device_order
from autotune.device.gpu_memory import GpuMemoryWatch
from autotune.units import format_bytes

ALLOCATOR_RESERVED = "allocator-reserved"  # no NVML: torch's reserved peak, which misses the context
RSS = "rss"  # CPU: the process's peak resident set size


class CudaSession:
    """One measurement's CUDA device: `start()` first, then the loop's calls."""

    def __init__(self, device: str, info: DeviceInfo, memory_limit_bytes: int | None) -> None:
        self.index = cuda_index(device)
        self.device = torch.device("cuda", self.index)
        self.info = info
        self.limit = memory_limit_bytes
        self.memory = GpuMemoryWatch(info.uuid)
        self.cuda_total: int | None = None  # the total CUDA sees (the allocator's fraction is of it)
        self.fraction: float | None = None

    def start(self) -> None:
        pin_cuda_device_order()
        self.memory.take_baseline(cuda_started=torch.cuda.is_initialized())
        torch.cuda.set_device(self.index)
        _free, self.cuda_total = torch.cuda.mem_get_info(self.index)  # makes the context now
        torch.cuda.reset_peak_memory_stats(self.index)
        self.cap_allocator()

    def cap_allocator(self) -> None:
        """Make the allocator refuse to grow past the limit less what it does not manage, so
        an over-limit configuration fails fast as `oom` instead of taking the card from other
        processes, and one that passes the cap is not judged over the limit afterwards (the
        verdict reads NVML, which counts the context and the libraries too)."""
        if not self.limit or not self.cuda_total:
            return
        own = self.memory.sample()
        reserved = torch.cuda.memory_reserved(self.index)
        overhead = max(0, own - reserved) if own is not None else 0
        allowed = self.limit - overhead
        if allowed <= 0:
            raise MemoryError(
                f"the memory limit {format_bytes(self.limit)} leaves nothing for tensors once the CUDA context "
                f"and libraries take {format_bytes(overhead)}"
            )
        self.fraction = min(1.0, allowed / self.cuda_total)
        torch.cuda.set_per_process_memory_fraction(self.fraction, self.index)

    def after_warm_up(self) -> None:
        """Warm-up loaded the libraries and kernels, and its widest shapes set the allocator's
        peak: read the memory now, and tighten the cap to the overhead measured now."""
        self.cap_allocator() if self.limit else self.memory.sample()

    def sync(self) -> None:
        torch.cuda.synchronize(self.index)

    def clock(self) -> "CudaStepClock":
        return CudaStepClock(self.index)

    def sampler(self) -> GpuSampler:
        return GpuSampler(self.memory.handle, self.memory)

    def peak_memory(self) -> tuple[int, str, int | None]:
        """(peak bytes, source, allocator peak): NVML's figure where it can be read (see
        `device.gpu_memory`), else the allocator's reserved peak."""
        self.memory.sample()
        allocator_peak = int(torch.cuda.max_memory_allocated(self.index))
        reading = self.memory.peak()
        if reading is not None:
            return reading[0], reading[1], allocator_peak
        return int(torch.cuda.max_memory_reserved(self.index)), ALLOCATOR_RESERVED, allocator_peak

    def reserved_peak(self) -> int:
        """torch's reserved peak (segments the caching allocator holds), beside the allocated
        peak of `peak_memory`: their gap is the cache and its fragmentation."""
        return int(torch.cuda.max_memory_reserved(self.index))

    def restart_peak(self) -> None:
        """Count every peak from now on (one phase of a run): torch's and NVML's."""
        torch.cuda.reset_peak_memory_stats(self.index)
        self.memory.restart()

    def release(self) -> None:
        """After a failed run: give cached blocks back, so a retry in this process starts clean."""
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


class CudaStepClock:
    """Step boundaries as CUDA events on the measured device's current stream: timestamps on
    the device's own timeline, with no synchronize per step (which would stop the host from
    queueing ahead, as a real training loop does). Read after the caller's synchronize."""

    def __init__(self, index: int) -> None:
        self.stream = torch.cuda.current_stream(index)
        self.marks: list[Any] = []
        self.settled: list[float] = []  # durations of the marks already passed and released

    def mark(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        self.marks.append(event)
        self._settle()

    def _settle(self) -> None:
        """The durations between marks the device has passed, kept as numbers and their events
        released: a run of any length (the meter in a user's loop) holds the few events the
        device has not reached, not one a step. Never waits: an event is asked, not synchronized."""
        done = 0
        while done + 1 < len(self.marks) and self.marks[done + 1].query():
            self.settled.append(self.marks[done].elapsed_time(self.marks[done + 1]) / 1000.0)
            done += 1
        del self.marks[:done]

    def durations(self) -> list[float]:
        if self.marks:
            self.marks[-1].synchronize()  # stream order: every earlier mark is complete too
        return self.settled + [a.elapsed_time(b) / 1000.0 for a, b in zip(self.marks, self.marks[1:])]


class HostSession:
    """The CPU's side of a measurement: the work is synchronous, the clock is the host's."""

    device = torch.device("cpu")

    def start(self) -> None:
        pass

    def after_warm_up(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def clock(self) -> "HostStepClock":
        return HostStepClock()

    def sampler(self) -> GpuSampler:
        return GpuSampler(None)

    def peak_memory(self) -> tuple[int, str, int | None]:
        return peak_rss_bytes(), RSS, None

    def release(self) -> None:
        pass


class HostStepClock:
    def __init__(self) -> None:
        self.marks: list[float] = []

    def mark(self) -> None:
        self.marks.append(time.perf_counter())

    def durations(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def session_for(device: str, info: DeviceInfo, memory_limit_bytes: int | None) -> CudaSession | HostSession:
    return CudaSession(device, info, memory_limit_bytes) if info.kind == "cuda" else HostSession()
