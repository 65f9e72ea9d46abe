"""Device facts, memory and utilization readings, and the peak-FLOPs table.

CUDA devices are described through NVML (the `pynvml` module of nvidia-ml-py), which needs
no CUDA context: the tuner process never initializes CUDA, so it holds no GPU memory that
NVML would count against the trials. NVML indices follow PCI bus order while CUDA's default
order is "fastest first", so devices are matched by UUID, never by index.
When NVML is missing or fails, readings fall back to torch's allocator, said once."""

from __future__ import annotations

import logging
import os
import platform
import re
import resource
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    name: str
    uuid: str | None = None
    index: int | None = None
    total_memory_bytes: int | None = None
    compute_capability: str | None = None  # "9.0"
    driver: str | None = None
    cuda: str | None = None
    torch: str = torch.__version__
    cpu_count: int = os.cpu_count() or 1

    @property
    def slug(self) -> str:
        """A study-name-friendly name: "NVIDIA H200" -> "nvidia-h200"."""
        if self.kind == "cpu":
            return "cpu"
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")

    @property
    def capability_tuple(self) -> tuple[int, int] | None:
        if not self.compute_capability:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DeviceInfo":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: str) -> DeviceInfo:
    """Facts about `cpu`, `cuda` or `cuda:N`, for study attrs, recipes and support rules."""
    if device == "cpu":
        return DeviceInfo(kind="cpu", name=cpu_name())
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    info = _describe_cuda_nvml(index)
    return info if info is not None else _describe_cuda_torch(index)


def resolve_device(device: str) -> str:
    """`auto` -> `cuda` when a GPU is visible (through NVML, not a CUDA context), else `cpu`."""
    if device != "auto":
        return device
    return "cuda" if visible_gpu_count() > 0 else "cpu"


def visible_gpu_count() -> int:
    uuids = visible_gpu_uuids()
    if uuids is not None:
        return len(uuids)
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# --- NVML -------------------------------------------------------------------------------

_nvml_state: dict[str, Any] = {"ok": None}


def nvml():
    """The initialized pynvml module, or None (said once) when NVML cannot be used."""
    if _nvml_state["ok"] is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml_state.update(ok=True, module=pynvml)
        except Exception as exc:  # missing library, no driver, no device: all mean "no NVML"
            _nvml_state["ok"] = False
            if torch.cuda.is_available() or os.path.exists("/dev/nvidiactl"):
                log.warning("NVML unavailable (%s): memory figures come from torch's allocator", exc)
    return _nvml_state.get("module") if _nvml_state["ok"] else None


def visible_gpu_uuids() -> list[str] | None:
    """UUIDs of the GPUs this process may use, in CUDA order (CUDA_VISIBLE_DEVICES honoured)."""
    pynvml = nvml()
    if pynvml is None:
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
    except Exception:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        # Without CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA's order may differ; trials are pinned by UUID.
        return uuids
    chosen = []
    for entry in (e.strip() for e in visible.split(",") if e.strip()):
        if entry.isdigit() and int(entry) < len(uuids):
            chosen.append(uuids[int(entry)])
        else:
            match = [u for u in uuids if u.startswith(entry if entry.startswith("GPU-") else f"GPU-{entry}")]
            if not match:
                break  # CUDA stops at the first invalid entry too
            chosen.append(match[0])
    return chosen


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_handle(uuid: str):
    pynvml = nvml()
    if pynvml is None or not uuid:
        return None
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
    except Exception:
        return None


def _describe_cuda_nvml(index: int) -> DeviceInfo | None:
    uuids = visible_gpu_uuids()
    if not uuids or index >= len(uuids):
        return None
    pynvml = nvml()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuids[index].encode())
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        cuda_driver = pynvml.nvmlSystemGetCudaDriverVersion()
        return DeviceInfo(
            kind="cuda",
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            uuid=uuids[index],
            index=index,
            total_memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            compute_capability=f"{major}.{minor}",
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            cuda=torch.version.cuda or f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}",
        )
    except Exception as exc:
        log.warning("NVML could not describe GPU %d (%s); asking torch instead", index, exc)
        return None


def _describe_cuda_torch(index: int) -> DeviceInfo:
    from autotune.errors import UsageError

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise UsageError(f"device cuda:{index} is not available here; use --device cpu or another index")
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    return DeviceInfo(
        kind="cuda",
        name=props.name,
        uuid=f"GPU-{uuid}" if uuid is not None and not str(uuid).startswith("GPU-") else (str(uuid) if uuid else None),
        index=index,
        total_memory_bytes=int(props.total_memory),
        compute_capability=f"{props.major}.{props.minor}",
        cuda=torch.version.cuda,
    )


# --- memory and utilization ---------------------------------------------------------------


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM), the CPU analogue of peak GPU memory."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def process_gpu_memory_bytes(handle, pid: int) -> int | None:
    """GPU memory NVML attributes to `pid` on this device (context + allocator segments)."""
    pynvml = nvml()
    if pynvml is None or handle is None:
        return None
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return None
    used = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
    return int(sum(used)) if used else None


class GpuSampler:
    """Samples NVML utilization and this process's GPU memory in a background thread while
    the timed steps run: a starved GPU shows low utilization, the article's first symptom.
    With no NVML it samples nothing and reports None (a null object, no branches outside)."""

    def __init__(self, uuid: str | None, interval_s: float = 0.02) -> None:
        self._handle = nvml_handle(uuid) if uuid else None
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._util: list[int] = []
        self.peak_process_memory: int | None = None

    @property
    def active(self) -> bool:
        return self._handle is not None

    def sample_memory(self) -> None:
        used = process_gpu_memory_bytes(self._handle, os.getpid())
        if used is not None:
            self.peak_process_memory = max(self.peak_process_memory or 0, used)

    def _run(self) -> None:
        pynvml = nvml()
        while not self._stop.is_set():
            try:
                self._util.append(int(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            except Exception:
                pass
            self.sample_memory()
            time.sleep(self._interval)

    def __enter__(self) -> "GpuSampler":
        if self.active:
            self._thread = threading.Thread(target=self._run, name="autotune-nvml", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.active:
            self.sample_memory()

    @property
    def mean_utilization(self) -> float | None:
        return sum(self._util) / len(self._util) / 100.0 if self._util else None


# --- peak FLOPs ----------------------------------------------------------------------------

# Dense (no sparsity) peak FLOP/s by device name fragment and compute dtype. Each entry cites
# its source. Order matters: the first fragment found in the device name wins.
PEAK_FLOPS: list[tuple[str, dict[str, float], str]] = [
    ("H200", {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 66.9e12},
     "NVIDIA H200 datasheet (SXM), same tensor cores as H100 SXM; dense, without sparsity"),
    ("H100 PCIe", {"bfloat16": 756e12, "float16": 756e12, "tf32": 378e12, "float32": 51.2e12},
     "NVIDIA H100 datasheet, PCIe column, dense"),
    ("H100", {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 66.9e12},
     "NVIDIA H100 datasheet, SXM column, dense"),
    ("A100", {"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12},
     "NVIDIA A100 datasheet, dense"),
    ("L40S", {"bfloat16": 362e12, "float16": 362e12, "tf32": 183e12, "float32": 91.6e12},
     "NVIDIA L40S datasheet, dense"),
    ("L4", {"bfloat16": 121e12, "float16": 121e12, "tf32": 60e12, "float32": 30.3e12},
     "NVIDIA L4 datasheet, dense"),
    ("A10", {"bfloat16": 125e12, "float16": 125e12, "tf32": 62.5e12, "float32": 31.2e12},
     "NVIDIA A10 datasheet, dense"),
    ("RTX 4090", {"bfloat16": 165.2e12, "float16": 165.2e12, "tf32": 82.6e12, "float32": 82.6e12},
     "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090, FP32-accumulate dense"),
    ("V100", {"float16": 125e12, "float32": 15.7e12},
     "NVIDIA V100 datasheet (SXM2), dense"),
]


def peak_flops(device_name: str, amp_dtype: str) -> float | None:
    """Peak FLOP/s of this device in the dtype the matmuls run in; None when unknown (CPUs)."""
    for fragment, by_dtype, _source in PEAK_FLOPS:
        if fragment in device_name:
            return by_dtype.get(amp_dtype)
    return None
