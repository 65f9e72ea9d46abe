"""NVML (the `pynvml` module of nvidia-ml-py): GPU identity, memory and utilization with no
CUDA context, so the tuner process holds no GPU memory that NVML would count against the
trials. NVML indices follow PCI bus order while CUDA's default order is "fastest first", so
devices are matched by UUID, never by index, and every autotune process that touches CUDA
sets CUDA_DEVICE_ORDER=PCI_BUS_ID first (`device.info.pin_cuda_device_order`).

MIG: a GPU in MIG mode cannot be used whole; CUDA sees one of its instances when
CUDA_VISIBLE_DEVICES names it (`MIG-<uuid>`, or the older `MIG-GPU-<uuid>/<gi>/<ci>`), and a
process enumerates a single MIG instance at most (NVIDIA MIG user guide, "CUDA device
enumeration"). Anything else that would put a MIG-mode GPU in front of CUDA is refused here
with a message naming the instances, rather than guessed.

When NVML is missing or fails, every reading here is None and the caller falls back to
torch's allocator, said once."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from autotune.errors import UsageError

log = logging.getLogger(__name__)

_nvml_state: dict[str, Any] = {"ok": None}


def load_nvml():
    """The initialized pynvml module, or None (said once) when NVML cannot be used."""
    if _nvml_state["ok"] is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml_state.update(ok=True, module=pynvml)
        except Exception as exc:  # missing library, no driver, no device: all mean "no NVML"
            _nvml_state["ok"] = False
            if _cuda_is_likely_present():
                log.warning("NVML unavailable (%s): memory figures come from torch's allocator", exc)
    return _nvml_state.get("module") if _nvml_state["ok"] else None


def _cuda_is_likely_present() -> bool:
    if os.path.exists("/dev/nvidiactl"):
        return True
    import torch

    return torch.cuda.is_available()


def text(value: bytes | str) -> str:
    """NVML returns bytes in older bindings and str in newer ones."""
    return value.decode() if isinstance(value, bytes) else value


# --- which GPUs this process can use ------------------------------------------------------------


@dataclass(frozen=True)
class MigInstance:
    uuid: str  # "MIG-..."
    parent_uuid: str  # "GPU-..."
    gpu_instance: int
    compute_instance: int


@dataclass(frozen=True)
class PhysicalGpu:
    index: int  # NVML's index: PCI bus order
    uuid: str  # "GPU-..."
    mig: tuple[MigInstance, ...] | None  # None: MIG mode off (or not supported)


def physical_gpus() -> list[PhysicalGpu] | None:
    """Every GPU of this host in NVML (PCI bus) order, with its MIG instances when in MIG
    mode; None without NVML."""
    pynvml = load_nvml()
    if pynvml is None:
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(pynvml.nvmlDeviceGetUUID(handle))
            gpus.append(PhysicalGpu(index, uuid, _mig_instances(pynvml, handle, uuid)))
        return gpus
    except Exception as exc:
        log.warning("NVML could not list the GPUs (%s)", exc)
        return None


def _mig_instances(pynvml, handle, parent_uuid: str) -> tuple[MigInstance, ...] | None:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # NOT_SUPPORTED: a GPU without MIG
        return None
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return None
    instances = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:  # an empty slot
            continue
        instances.append(
            MigInstance(
                uuid=text(pynvml.nvmlDeviceGetUUID(mig)),
                parent_uuid=parent_uuid,
                gpu_instance=pynvml.nvmlDeviceGetGpuInstanceId(mig),
                compute_instance=pynvml.nvmlDeviceGetComputeInstanceId(mig),
            )
        )
    return tuple(instances)


def visible_gpu_uuids() -> list[str] | None:
    """UUIDs (GPU-... or MIG-...) of the CUDA devices this process may use, in CUDA's order
    (CUDA_VISIBLE_DEVICES honoured, PCI bus order assumed); None without NVML. A MIG-mode
    GPU that CUDA would be handed whole, or more than one MIG instance, is a UsageError."""
    gpus = physical_gpus()
    if gpus is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        for gpu in gpus:
            _refuse_whole_mig_gpu(gpu)
        return [gpu.uuid for gpu in gpus]
    chosen: list[str] = []
    for entry in (e.strip() for e in visible.split(",")):
        uuid = _match_visible_entry(entry, gpus)
        if uuid is None:
            break  # CUDA stops at the first invalid entry too
        chosen.append(uuid)
    migs = [u for u in chosen if u.startswith("MIG-")]
    if len(migs) > 1:
        raise UsageError(
            f"CUDA_VISIBLE_DEVICES names {len(migs)} MIG instances, and a CUDA process can use only one; "
            "give each process one instance (--devices MIG-...,MIG-... starts one worker per instance)"
        )
    return chosen


def _match_visible_entry(entry: str, gpus: list[PhysicalGpu]) -> str | None:
    """The UUID a CUDA_VISIBLE_DEVICES entry selects, or None when CUDA would find it invalid."""
    if entry.isdigit():
        gpu = gpus[int(entry)] if int(entry) < len(gpus) else None
    elif entry.startswith("MIG-"):
        return _match_mig(entry, gpus)
    else:
        prefix = entry if entry.startswith("GPU-") else f"GPU-{entry}"
        matches = [g for g in gpus if g.uuid.startswith(prefix)]
        gpu = matches[0] if len(matches) == 1 else None
    if gpu is not None:
        _refuse_whole_mig_gpu(gpu)
        return gpu.uuid
    return None


def _match_mig(entry: str, gpus: list[PhysicalGpu]) -> str | None:
    instances = [m for g in gpus for m in (g.mig or ())]
    if entry.startswith("MIG-GPU-") and entry.count("/") == 2:  # the older MIG-<GPU uuid>/<gi>/<ci> form
        parent, gi, ci = entry[len("MIG-") :].split("/")
        if not (gi.isdigit() and ci.isdigit()):
            return None
        found = [
            m
            for m in instances
            if m.parent_uuid.startswith(parent) and (m.gpu_instance, m.compute_instance) == (int(gi), int(ci))
        ]
    else:
        found = [m for m in instances if m.uuid.startswith(entry)]
    return found[0].uuid if len(found) == 1 else None


def _refuse_whole_mig_gpu(gpu: PhysicalGpu) -> None:
    if gpu.mig is None:
        return
    names = ", ".join(m.uuid for m in gpu.mig) or "none yet: create one with nvidia-smi mig"
    raise UsageError(
        f"GPU {gpu.index} ({gpu.uuid}) is in MIG mode and cannot be used whole: set CUDA_VISIBLE_DEVICES "
        f"to one of its MIG instances ({names}); `nvidia-smi -L` lists them"
    )


def nvml_handle(uuid: str | None):
    """The NVML handle of a GPU or MIG instance by UUID; None without NVML or when unknown."""
    pynvml = load_nvml()
    if pynvml is None or not uuid:
        return None
    try:
        if not uuid.startswith("MIG-"):
            return pynvml.nvmlDeviceGetHandleByUUID(uuid)
        for index in range(pynvml.nvmlDeviceGetCount()):  # MIG handles are found through their GPU
            parent = pynvml.nvmlDeviceGetHandleByIndex(index)
            for mig in _mig_handles(pynvml, parent):
                if text(pynvml.nvmlDeviceGetUUID(mig)) == uuid:
                    return mig
    except Exception:
        return None
    return None


def _mig_handles(pynvml, parent) -> list:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(parent)
    except pynvml.NVMLError:
        return []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    handles = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot))
        except pynvml.NVMLError_NotFound:
            continue
    return handles


# --- memory ---------------------------------------------------------------------------------


def device_used_bytes(handle) -> int | None:
    """Memory in use on the whole device (every process, plus the driver's own), as
    nvidia-smi shows it. In a container it is the only figure that sees this process."""
    pynvml = load_nvml()
    if pynvml is None or handle is None:
        return None
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:
        return None


def process_gpu_memory_bytes(handle, pid: int) -> int | None:
    """GPU memory NVML attributes to `pid` on this device (context + allocator segments).
    NVML reports PIDs of the host's namespace: inside a container they never equal
    os.getpid(), and this returns None."""
    pynvml = load_nvml()
    if pynvml is None or handle is None:
        return None
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return None
    used = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
    return int(sum(used)) if used else None


def compute_process_pids(handle) -> list[int] | None:
    """The PIDs NVML lists as computing on this device; None when it cannot say."""
    pynvml = load_nvml()
    if pynvml is None or handle is None:
        return None
    try:
        return [int(p.pid) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except Exception:
        return None


class GpuSampler:
    """Samples NVML utilization in a background thread while the timed steps run (a starved
    GPU shows low utilization, the article's first symptom), and feeds a memory watch (see
    `device.gpu_memory`) at the same pace. With no NVML it samples nothing and reports None
    (a null object, no branches outside)."""

    def __init__(self, handle, memory=None, interval_s: float = 0.02) -> None:
        self._handle = handle
        self._memory = memory  # a GpuMemoryWatch, or None
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._util: list[int] = []

    @property
    def active(self) -> bool:
        return self._handle is not None

    def _sample(self) -> None:
        pynvml = load_nvml()
        try:
            self._util.append(int(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
        except Exception:  # MIG instances have no utilization counter
            pass
        if self._memory is not None:
            self._memory.sample()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
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
        if self.active and self._memory is not None:
            self._memory.sample()

    @property
    def mean_utilization(self) -> float | None:
        return sum(self._util) / len(self._util) / 100.0 if self._util else None
