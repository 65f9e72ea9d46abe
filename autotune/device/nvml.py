"""NVML (the `pynvml` module of nvidia-ml-py): GPU identity, memory and utilization with no
CUDA context, so the tuner process holds no GPU memory that NVML would count against the
trials. NVML indices follow PCI bus order while CUDA's default order is "fastest first", so
devices are matched by UUID, never by index. When NVML is missing or fails, every reading
here is None and the caller falls back to torch's allocator, said once."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

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


def visible_gpu_uuids() -> list[str] | None:
    """UUIDs of the GPUs this process may use, in CUDA order (CUDA_VISIBLE_DEVICES honoured)."""
    pynvml = load_nvml()
    if pynvml is None:
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
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


def text(value: bytes | str) -> str:
    """NVML returns bytes in older bindings and str in newer ones."""
    return value.decode() if isinstance(value, bytes) else value


def nvml_handle(uuid: str):
    pynvml = load_nvml()
    if pynvml is None or not uuid:
        return None
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
    except Exception:
        return None


def process_gpu_memory_bytes(handle, pid: int) -> int | None:
    """GPU memory NVML attributes to `pid` on this device (context + allocator segments)."""
    pynvml = load_nvml()
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
        pynvml = load_nvml()
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
