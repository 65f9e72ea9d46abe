"""Peak GPU memory of this process, read through NVML in a way that also works in containers.

NVML attributes memory to processes by PID, but it reports the host's PIDs: inside a
container (its own PID namespace) none of them is os.getpid(), and the per-process figure
is lost. The device-level figure is not: "used" on the device, minus a baseline read before
this process started CUDA, is this process's memory (its CUDA context, library workspaces,
Triton modules and allocator segments), provided nothing else starts or stops on the
device meanwhile. autotune runs one trial per GPU at a time, so that holds for trials.

    nvml-process   NVML's figure for this PID (the host's PID namespace), preferred
    nvml-device    device used minus the baseline taken before CUDA started (containers)
    None           neither can be read: the caller falls back to torch's allocator

Both include what torch's allocator cannot see (0.5-1.5 GB: the context, cuBLAS/cuDNN
handles, loaded kernels), which is what the memory limit is about."""

from __future__ import annotations

import os

from autotune.device.nvml import device_used_bytes, nvml_handle, process_gpu_memory_bytes

NVML_PROCESS, NVML_DEVICE = "nvml-process", "nvml-device"


class GpuMemoryWatch:
    """The peak of this process's GPU memory on one device, over every `sample()`."""

    def __init__(self, uuid: str | None) -> None:
        self.handle = nvml_handle(uuid) if uuid else None
        self.baseline: int | None = None  # device used before this process started CUDA
        self.peak_process: int | None = None
        self.peak_device: int | None = None

    @property
    def active(self) -> bool:
        return self.handle is not None

    def take_baseline(self, *, cuda_started: bool) -> None:
        """Read the device's used memory now, before this process makes its CUDA context.
        Once CUDA has started here the reading would include our own context, so none is
        taken, and the device-level figure is not used."""
        if self.active and not cuda_started:
            self.baseline = device_used_bytes(self.handle)

    def sample(self) -> int | None:
        """Read NVML now; returns this process's memory by the best figure available."""
        process = process_gpu_memory_bytes(self.handle, os.getpid())
        if process is not None:
            self.peak_process = max(self.peak_process or 0, process)
        device = device_used_bytes(self.handle)
        if device is not None:
            self.peak_device = max(self.peak_device or 0, device)
        if process is not None:
            return process
        if device is not None and self.baseline is not None:
            return max(0, device - self.baseline)
        return None

    def restart(self) -> None:
        """Count the peak from now on: the peaks become the current reading."""
        self.peak_process = self.peak_device = None
        self.sample()

    def peak(self) -> tuple[int, str] | None:
        """(peak bytes, source) over the samples so far; None when NVML cannot say."""
        if self.peak_process is not None:
            return self.peak_process, NVML_PROCESS
        if self.peak_device is not None and self.baseline is not None:
            return max(0, self.peak_device - self.baseline), NVML_DEVICE
        return None
