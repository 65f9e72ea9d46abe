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

from autotune.device.nvml import load_nvml, nvml_handle, text, visible_gpu_uuids
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
        return DeviceInfo(kind="cpu", name=cpu_name(), torch=torch_version())
    pin_cuda_device_order()
    index = cuda_index(device)
    info = _describe_cuda_nvml(index)
    return info if info is not None else _describe_cuda_torch(index)


def cuda_index(device: str) -> int:
    """N of `cuda:N`; `cuda` alone is device 0, the device a fresh process starts on."""
    _kind, _, index = device.partition(":")
    return int(index) if index else 0


def resolve_device(device: str) -> str:
    """`auto` -> `cuda:0` when a GPU is visible (through NVML, not a CUDA context), else `cpu`;
    `cuda` -> `cuda:0`; `cuda:N` checked against the visible devices. A resolved CUDA device
    always carries its index: torch.cuda.set_device and set_per_process_memory_fraction
    refuse an index-less torch.device("cuda")."""
    name = device.strip()
    if name == "cpu":
        return name
    if name == "auto":
        if visible_gpu_count() > 0:
            return "cuda:0"
        if os.path.exists("/dev/nvidiactl"):
            log.warning("a GPU driver is present but no CUDA device is visible to this process: measuring on the CPU")
        return "cpu"
    kind, _, index = name.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise UsageError(f"unknown device {device!r}: expected auto, cpu, cuda or cuda:N")
    n = int(index or 0)
    count = visible_gpu_count()
    if n >= count:
        choices = f"cuda:0 to cuda:{count - 1}" if count else "no CUDA device is visible"
        raise UsageError(f"device cuda:{n} is not available here ({choices}); use --device cpu or another index")
    return f"cuda:{n}"


def pin_cuda_device_order() -> None:
    """CUDA numbers devices fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, while NVML and
    nvidia-smi number them by PCI bus: set it before CUDA starts, so that cuda:N is the GPU
    `describe` read. Trials get it from their runner; bench, profile and doctor run in the
    command's own process and get it here."""
    order = os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if order != "PCI_BUS_ID" and not _order_warned:
        _order_warned.append(order)
        log.warning(
            "CUDA_DEVICE_ORDER=%s: CUDA's device numbers may differ from nvidia-smi's; GPUs are matched by UUID "
            "where NVML can, but --device cuda:N counts in CUDA's order",
            order,
        )


_order_warned: list[str] = []


def visible_gpu_count() -> int:
    uuids = visible_gpu_uuids()
    if uuids is not None:
        return len(uuids)
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def torch_version() -> str:
    """torch's version, read from its installed metadata: no need to import torch (seconds).
    What every record of the software holds, so what a recipe is compared with: PyPI's CUDA
    wheels say "2.9.1" there, where torch.__version__ says "2.9.1+cu128"."""
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
        "torch": torch_version(),
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
        handle = nvml_handle(uuids[index])
        if handle is None:
            return None
        # A MIG instance has its own name ("... MIG 1g.18gb") and memory; its compute
        # capability is its GPU's.
        whole = (
            pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) if uuids[index].startswith("MIG-") else handle
        )
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(whole)
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
            torch=torch_version(),
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
        torch=torch_version(),
    )


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, as taskset or a container sets it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_host() -> str | None:
    """One line when this host's load over the last minute exceeds its usable CPUs, else None:
    on a busy host every measurement runs slower and noisier than on an idle one (a CPU trial's
    threads, one per core, wait for cores other processes hold: issue D, #2)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cpus = usable_cpus()
    if load <= cpus:
        return None
    return (
        f"this host is busy: a load of {load:.1f} over the last minute on {cpus} usable CPUs; measurements run "
        "slower and noisier than on an idle host (on a CPU, fewer threads may be faster: OMP_NUM_THREADS)"
    )
