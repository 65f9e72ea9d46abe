"""What a device is: `DeviceInfo`, read through NVML where it can be (no CUDA context is
made), else through torch; plus the software versions recorded beside it. torch is imported
only by the functions that need it."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import re
from dataclasses import asdict, dataclass
from typing import Any

from autotune.device.nvml import load_nvml, text, visible_gpu_uuids
from autotune.errors import UsageError

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
    torch: str = ""  # filled by describe()
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
        return DeviceInfo(kind="cpu", name=cpu_name(), torch=_torch_version())
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
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _torch_version() -> str:
    """torch's version, read from its installed metadata: no need to import torch (seconds)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        import torch

        return str(torch.__version__)


def software_versions() -> dict[str, str]:
    """What a study, a recipe and a measurement record of the software they ran on."""
    import optuna

    from autotune._version import __version__

    return {
        "torch": _torch_version(),
        "optuna": optuna.__version__,
        "autotune": __version__,
        "python": platform.python_version(),
    }


def _describe_cuda_nvml(index: int) -> DeviceInfo | None:
    uuids = visible_gpu_uuids()
    if not uuids or index >= len(uuids):
        return None
    import torch

    pynvml = load_nvml()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuids[index].encode())
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        cuda_driver = pynvml.nvmlSystemGetCudaDriverVersion()
        return DeviceInfo(
            kind="cuda",
            name=text(pynvml.nvmlDeviceGetName(handle)),
            uuid=uuids[index],
            index=index,
            total_memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            compute_capability=f"{major}.{minor}",
            driver=text(pynvml.nvmlSystemGetDriverVersion()),
            cuda=torch.version.cuda or f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}",
            torch=_torch_version(),
        )
    except Exception as exc:
        log.warning("NVML could not describe GPU %d (%s); asking torch instead", index, exc)
        return None


def _describe_cuda_torch(index: int) -> DeviceInfo:
    import torch

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
        torch=_torch_version(),
    )
