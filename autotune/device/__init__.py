"""Facts about the machine, read without touching the GPU: what the device is (`info`), its
memory and utilization through NVML (`nvml`), the host's memory (`memory`) and the peak
FLOPs table for MFU (`flops`), and the disks a run writes to (`disk`). Importing this package
does not import torch."""

from __future__ import annotations

from autotune.device.flops import PEAK_FLOPS, PeakFlops, peak_flops, peak_flops_entry
from autotune.device.info import (
    DeviceInfo,
    cuda_index,
    describe,
    pin_cuda_device_order,
    resolve_device,
    software_versions,
    torch_version,
    visible_gpu_count,
)
from autotune.device.memory import (
    ProcessTreeMemory,
    descendants,
    group_rss_bytes,
    host_memory_cap,
    peak_rss_bytes,
    total_host_memory,
)
from autotune.device.nvml import (
    GpuSampler,
    compute_process_pids,
    device_used_bytes,
    load_nvml,
    nvml_handle,
    physical_gpus,
    process_gpu_memory_bytes,
    visible_gpu_uuids,
)

__all__ = [
    "PEAK_FLOPS",
    "DeviceInfo",
    "GpuSampler",
    "PeakFlops",
    "ProcessTreeMemory",
    "compute_process_pids",
    "cuda_index",
    "describe",
    "descendants",
    "device_used_bytes",
    "group_rss_bytes",
    "host_memory_cap",
    "load_nvml",
    "nvml_handle",
    "peak_flops",
    "peak_flops_entry",
    "peak_rss_bytes",
    "physical_gpus",
    "pin_cuda_device_order",
    "process_gpu_memory_bytes",
    "resolve_device",
    "software_versions",
    "torch_version",
    "total_host_memory",
    "visible_gpu_count",
    "visible_gpu_uuids",
]
