"""Strict fakes of a CUDA machine, so the CPU suite runs autotune's CUDA paths.

    machine = FakeMachine([FakeGpu()])          # one H200; container=True: NVML sees host PIDs
    cuda = install(machine, monkeypatch.setattr)  # NVML + torch.cuda replaced, tensors on the CPU

NVML: a fake libnvidia-ml (`FakeNvmlLib`) under the real pynvml module, so pynvml's own
wrappers marshal every argument through ctypes and turn return codes into its own
NVMLError classes, as they do over the real library. Handles are pointers the fake hands
out; an unknown one is NVML_ERROR_INVALID_ARGUMENT. It answers in PCI bus order, knows MIG
mode and MIG instances (names "<card> MIG <profile>", their own memory, no utilization),
and lists this process under the host's PID when `container` is set, as NVML does inside a
PID namespace.

torch.cuda: torch's own Python functions run (set_device, synchronize, memory_stats,
reset_peak_memory_stats, set_per_process_memory_fraction, mem_get_info, empty_cache,
is_available, device_count, current_device, get_device_properties, manual_seed_all), over
fake versions of the C entry points a CPU build lacks (`torch._C._cuda_*`). So an index-less
torch.device("cuda") is refused by torch's `_get_device_index` exactly where the real one
refuses it, and a bad fraction by torch's own checks. What the CPU build stubs in Python
(streams, events) is faked here with torch's rules: `current_stream` validates its device
with `_get_device_index`; an Event is recorded on its device's stream only, and
`elapsed_time` needs both events recorded with enable_timing and complete (a synchronize
of the device, or of a later event on the stream, since they were recorded). Stricter than
CUDA, to catch measuring mistakes: an event recorded on a stream of another device than
the one the work was sent to is refused.

CUDA's device order: fixed at the first CUDA call from CUDA_VISIBLE_DEVICES and
CUDA_DEVICE_ORDER (fastest first, by `FakeGpu.speed`, unless PCI_BUS_ID), as the driver
does; a single MIG instance at most; a MIG-mode GPU is never enumerated whole.

Tensors: `CudaOnCpu` (a TorchFunctionMode) puts every tensor sent to "cuda:N" on the CPU,
checks N, creates the context as the first CUDA tensor would, and records the device the
work went to (`FakeCuda.work_devices`). Memory: the context, the allocator's reserved and
allocated bytes and the memory the allocator does not manage (`extra`: library handles,
kernels) are state the test sets or grows (`FakeCuda.allocate`, `on_sync`); NVML and
cudaMemGetInfo read the same state, and `allocate` enforces the allocator's fraction cap
as the caching allocator does.

In a child process (a trial, a --devices worker): `child_env(machine, tmp_path)` gives an
environment whose sitecustomize installs the same fakes at interpreter start.

Fork: torch's rule. A process forked after its parent initialized CUDA is "in a bad fork"
(torch marks the child from an at-fork handler it registers when CUDA starts): its first CUDA
call raises "Cannot re-initialize CUDA in forked subprocess...", torch.cuda.is_initialized()
is False there and torch.manual_seed leaves CUDA alone. A fork before CUDA started (the trial
fork server's) is fine."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pynvml
import torch
from torch.cuda._utils import _get_device_index
from torch.overrides import TorchFunctionMode

MiB, GiB = 1024**2, 1024**3
H200_TOTAL = 150_754_820_096  # NVML's total of an H200 (143,771 MiB)
FAKE_ENV = "AUTOTUNE_FAKE_GPU_MACHINE"
ROOT = Path(__file__).resolve().parent.parent


# --- the machine ----------------------------------------------------------------------------


@dataclass
class FakeMig:
    uuid: str
    profile: str = "1g.18gb"
    memory: int = 18 * GiB
    sm_count: int = 16
    gpu_instance: int = 9
    compute_instance: int = 0
    others_used: int = 0


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-0a1b2c3d-0000-4000-8000-000000000001"
    memory: int = H200_TOTAL
    capability: tuple[int, int] = (9, 0)
    sm_count: int = 132
    speed: int = 10  # CUDA's default order: fastest first
    mig_capable: bool = True
    migs: list[FakeMig] | None = None  # None: MIG mode off
    others_used: int = 300 * MiB  # what the driver and other processes hold on it
    utilization: int = 97
    power_w: float = 700.0  # what its energy counter accumulates, per second of the host's clock
    energy_counter: bool = True  # False: NVML answers NOT_SUPPORTED (GPUs before Volta)


@dataclass
class FakeMachine:
    gpus: list[FakeGpu] = field(default_factory=lambda: [FakeGpu()])
    driver: str = "570.124.06"
    cuda_driver: int = 12080  # 12.8
    nvml_version: str = "12.570.124.06"
    container: bool = False  # NVML lists this process under a host PID, never os.getpid()
    context_bytes: int = 600 * MiB
    nvml: bool = True  # False: libnvidia-ml cannot be loaded (a driver without it, a bare container)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "FakeMachine":
        raw = json.loads(text)
        gpus = []
        for g in raw.pop("gpus"):
            migs = g.pop("migs")
            gpus.append(
                FakeGpu(
                    **{**g, "capability": tuple(g["capability"])},
                    migs=None if migs is None else [FakeMig(**m) for m in migs],
                )
            )
        return cls(gpus=gpus, **raw)


@dataclass
class Unit:
    """What CUDA enumerates and NVML measures: a whole GPU, or one MIG instance of it."""

    gpu: FakeGpu
    mig: FakeMig | None = None

    @property
    def uuid(self) -> str:
        return self.mig.uuid if self.mig else self.gpu.uuid

    @property
    def name(self) -> str:
        return f"{self.gpu.name} MIG {self.mig.profile}" if self.mig else self.gpu.name

    @property
    def memory(self) -> int:
        return self.mig.memory if self.mig else self.gpu.memory

    @property
    def others_used(self) -> int:
        return self.mig.others_used if self.mig else self.gpu.others_used


def cuda_enumeration(machine: FakeMachine, env: dict[str, str]) -> list[Unit]:
    """The devices CUDA shows a process, in its order, as the driver decides them."""
    gpus = list(machine.gpus)  # PCI bus order
    if env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        gpus.sort(key=lambda g: -g.speed)  # CUDA's default: fastest first
    visible = env.get("CUDA_VISIBLE_DEVICES")
    chosen: list[Unit] = []
    if visible is None:
        chosen = [Unit(g) for g in gpus if g.migs is None]
    else:
        for entry in (e.strip() for e in visible.split(",")):
            unit = _match_entry(entry, gpus)
            if unit is None:
                break  # CUDA ignores the rest after an invalid entry
            if unit.mig is None and unit.gpu.migs is not None:
                continue  # a MIG-mode GPU is not usable whole
            chosen.append(unit)
    migs = [u for u in chosen if u.mig is not None]
    return [u for u in chosen if u.mig is None or u is migs[0]]  # one MIG instance per process


def _match_entry(entry: str, gpus: list[FakeGpu]) -> Unit | None:
    if entry.isdigit():
        return Unit(gpus[int(entry)]) if int(entry) < len(gpus) else None
    if entry.startswith("MIG-"):
        found = [Unit(g, m) for g in gpus for m in (g.migs or ()) if m.uuid.startswith(entry)]
        if entry.startswith("MIG-GPU-") and entry.count("/") == 2:
            parent, gi, ci = entry[4:].split("/")
            found = [
                Unit(g, m)
                for g in gpus
                for m in (g.migs or ())
                if g.uuid.startswith(parent) and f"{m.gpu_instance}/{m.compute_instance}" == f"{gi}/{ci}"
            ]
        return found[0] if len(found) == 1 else None
    found = [Unit(g) for g in gpus if g.uuid.startswith(entry if entry.startswith("GPU-") else f"GPU-{entry}")]
    return found[0] if len(found) == 1 else None


# --- the process's CUDA state ------------------------------------------------------------------

# torch.cuda._lazy_init's words (torch/cuda/__init__.py), for a CUDA call in a bad fork.
BAD_FORK = (
    "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the "
    "'spawn' start method"
)
_LIVE: "weakref.WeakSet[FakeCuda]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """torch's at-fork handler: a child of a process whose CUDA was initialized is in a bad fork."""
    for cuda in list(_LIVE):
        cuda.bad_fork = cuda.bad_fork or cuda.initialized


os.register_at_fork(after_in_child=_after_fork_in_child)


class FakeCuda:
    """One process's CUDA: its device order, contexts, allocator and events."""

    def __init__(self, machine: FakeMachine) -> None:
        self.machine = machine
        self.units: list[Unit] | None = None
        self.initialized = False
        self.current = 0
        self.contexts: set[int] = set()
        self.reserved: dict[int, int] = {}
        self.allocated: dict[int, int] = {}
        self.peak_reserved: dict[int, int] = {}
        self.peak_allocated: dict[int, int] = {}
        self.extra: dict[int, int] = {}  # memory the allocator does not manage: handles, kernels
        self.fraction: dict[int, float] = {}
        self.fraction_calls: list[tuple[float, int]] = []
        self.sync_epoch: dict[int, int] = {}
        self.work_devices: list[int] = []
        self.event_devices: list[int] = []
        self.seeds: list[int] = []
        self.on_sync: list[Callable[["FakeCuda", int], None]] = []
        self.order_at_init: str | None = None
        self.bad_fork = False  # forked after this process's CUDA was initialized (see BAD_FORK)
        _LIVE.add(self)

    # enumeration, fixed at the first call, as the driver reads its environment once
    def enumerate(self) -> list[Unit]:
        if self.units is None:
            self.order_at_init = os.environ.get("CUDA_DEVICE_ORDER")
            self.units = cuda_enumeration(self.machine, dict(os.environ))
        return self.units

    def check_ordinal(self, index: int) -> None:
        if not isinstance(index, int) or not 0 <= index < len(self.enumerate()):
            raise RuntimeError(
                "CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported at some "
                "other API call, so the stacktrace below might be incorrect."
            )

    def unit(self, index: int) -> Unit:
        self.check_ordinal(index)
        return self.enumerate()[index]

    def check_fork(self) -> None:
        if self.bad_fork:
            raise RuntimeError(BAD_FORK)

    def lazy_init(self) -> None:
        self.check_fork()
        self.enumerate()
        if not self.enumerate():
            raise RuntimeError("No CUDA GPUs are available")
        self.initialized = True

    def touch(self, index: int) -> None:
        """A CUDA call that needs a context on `index` makes it (the primary context)."""
        self.check_fork()
        self.check_ordinal(index)
        self.initialized = True
        self.contexts.add(index)

    def own_bytes(self, index: int) -> int:
        if index not in self.contexts:
            return 0
        return self.machine.context_bytes + self.reserved.get(index, 0) + self.extra.get(index, 0)

    def index_of(self, uuid: str) -> int | None:
        for i, unit in enumerate(self.units or ()):
            if unit.uuid == uuid:
                return i
        return None

    def allocate(self, index: int, nbytes: int) -> None:
        """Grow the allocator's segments by `nbytes`, refused past the fraction cap as torch's
        caching allocator refuses it (an OutOfMemoryError)."""
        self.touch(index)
        reserved = self.reserved.get(index, 0) + nbytes
        cap = self.fraction.get(index)
        if cap is not None and reserved > cap * self.unit(index).memory:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes / MiB:.2f} MiB. GPU {index} has a total capacity "
                f"of {self.unit(index).memory / GiB:.2f} GiB; this process's limit is set by "
                "set_per_process_memory_fraction"
            )
        self.reserved[index] = reserved
        self.allocated[index] = self.allocated.get(index, 0) + nbytes
        self.peak_reserved[index] = max(self.peak_reserved.get(index, 0), reserved)
        self.peak_allocated[index] = max(self.peak_allocated.get(index, 0), self.allocated[index])

    # torch._C entry points ---------------------------------------------------------------------

    def c_get_device_count(self) -> int:
        return len(self.enumerate())

    def c_set_device(self, index: int) -> None:
        self.touch(index)  # cudaSetDevice makes the primary context (CUDA 12)
        self.current = index

    def c_get_device(self) -> int:
        return self.current

    def c_accelerator_set_device_index(self, index: int) -> None:
        """torch.accelerator.set_device_index's C call, with CUDA the accelerator (the DataLoader's
        pin-memory thread makes it with its device's index): a negative index is a no-op, as
        torch documents; any other is cudaSetDevice's."""
        if not isinstance(index, int):
            raise TypeError(f"_accelerator_setDeviceIndex(): argument 'device_index' must be int, not {type(index)}")
        if index >= 0:
            self.c_set_device(index)

    def c_synchronize(self) -> None:
        self.touch(self.current)
        self.sync_epoch[self.current] = self.sync_epoch.get(self.current, 0) + 1
        for hook in list(self.on_sync):
            hook(self, self.current)

    def c_reset_peak_memory_stats(self, index: int) -> None:
        self.check_ordinal(index)
        self.peak_reserved[index] = self.reserved.get(index, 0)
        self.peak_allocated[index] = self.allocated.get(index, 0)

    def c_memory_stats(self, index: int) -> dict[str, Any]:
        self.check_ordinal(index)

        def stat(current: int, peak: int) -> dict[str, Any]:
            return {"all": {"current": current, "peak": peak, "allocated": peak, "freed": peak - current}}

        return {
            "allocated_bytes": stat(self.allocated.get(index, 0), self.peak_allocated.get(index, 0)),
            "reserved_bytes": stat(self.reserved.get(index, 0), self.peak_reserved.get(index, 0)),
            "num_ooms": 0,
        }

    def c_set_memory_fraction(self, fraction: float, index: int) -> None:
        self.check_ordinal(index)
        self.fraction[index] = fraction
        self.fraction_calls.append((fraction, index))

    def c_empty_cache(self) -> None:
        for index in self.reserved:
            self.reserved[index] = self.allocated.get(index, 0)

    # torch.cuda functions the CPU build stubs in Python ------------------------------------------

    def is_initialized(self) -> bool:
        return self.initialized and not self.bad_fork  # torch.cuda.is_initialized's rule

    def is_in_bad_fork(self) -> bool:
        return self.bad_fork

    def exchange_device(self, index: int) -> int:
        if index < 0:
            return -1
        self.check_ordinal(index)
        previous, self.current = self.current, index
        return previous

    def get_device_properties(self, index: int) -> SimpleNamespace:
        unit = self.unit(index)
        major, minor = unit.gpu.capability
        return SimpleNamespace(
            name=unit.name,
            total_memory=unit.memory,
            major=major,
            minor=minor,
            multi_processor_count=unit.mig.sm_count if unit.mig else unit.gpu.sm_count,
            uuid=unit.uuid.split("-", 1)[1],
        )

    def current_stream(self, device: Any = None) -> "FakeStream":
        torch.cuda._lazy_init()
        return FakeStream(self, _get_device_index(device, optional=True))

    def mem_get_info(self, index: int) -> tuple[int, int]:
        self.touch(index)
        unit = self.unit(index)
        used = unit.others_used + sum(self.own_bytes(i) for i, u in enumerate(self.units) if u.uuid == unit.uuid)
        return unit.memory - used, unit.memory


class FakeStream:
    def __init__(self, cuda: FakeCuda, device_index: int) -> None:
        cuda.check_ordinal(device_index)
        self.cuda, self.device_index = cuda, device_index
        self.device = torch.device("cuda", device_index)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream) and other.device_index == self.device_index

    def __hash__(self) -> int:
        return hash(self.device_index)


def make_event_class(cuda: FakeCuda) -> type:
    class FakeEvent:
        """torch.cuda.Event's rules (c10/cuda/CUDAEvent.h), on the host's clock."""

        def __init__(
            self,
            enable_timing: bool = False,
            blocking: bool = False,
            interprocess: bool = False,
            external: bool = False,
        ) -> None:
            self.enable_timing = enable_timing
            self.device_index: int | None = None
            self.recorded_at: float | None = None
            self.epoch: int | None = None
            self.synced = False

        def record(self, stream: FakeStream | None = None) -> None:
            if stream is None:
                stream = torch.cuda.current_stream()
            if not isinstance(stream, FakeStream):
                raise TypeError(f"record() expects a torch.cuda.Stream, got {type(stream).__name__}")
            if self.device_index is not None and stream.device_index != self.device_index:
                raise RuntimeError(
                    f"Event device {self.device_index} does not match recording stream's device {stream.device_index}."
                )
            if cuda.work_devices and cuda.work_devices[-1] != stream.device_index:
                raise AssertionError(
                    f"an event recorded on cuda:{stream.device_index}'s stream while the work was sent to "
                    f"cuda:{cuda.work_devices[-1]}: it would time the wrong device"
                )
            cuda.touch(stream.device_index)
            self.device_index = stream.device_index
            self.recorded_at = time.perf_counter()
            self.epoch = cuda.sync_epoch.get(stream.device_index, 0)
            self.synced = False
            cuda.event_devices.append(stream.device_index)
            events_on_stream.append(self)

        def query(self) -> bool:
            if self.recorded_at is None:
                return True  # an event never recorded is complete, as in CUDA
            return self.synced or cuda.sync_epoch.get(self.device_index, 0) > self.epoch

        def synchronize(self) -> None:
            if self.recorded_at is None:
                return
            for event in events_on_stream:  # stream order: what was recorded before is done too
                if event.device_index == self.device_index and event.recorded_at <= self.recorded_at:
                    event.synced = True

        def elapsed_time(self, end_event: "FakeEvent") -> float:
            if self.recorded_at is None or end_event.recorded_at is None:
                raise RuntimeError("Both events must be recorded before calculating elapsed time.")
            if not (self.query() and end_event.query()):
                raise RuntimeError("Both events must be completed before calculating elapsed time.")
            if not (self.enable_timing and end_event.enable_timing):
                raise RuntimeError("CUDA error: invalid resource handle")  # cudaEventElapsedTime without timing
            return (end_event.recorded_at - self.recorded_at) * 1000.0

    events_on_stream: list[FakeEvent] = []
    return FakeEvent


class CudaOnCpu(TorchFunctionMode):
    """Tensors sent to "cuda:N" stay on the CPU; N is checked and recorded, and the first one
    makes N's context, as a real CUDA tensor would."""

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.cuda = cuda

    def _redirect(self, value: Any) -> Any:
        device = None
        if isinstance(value, torch.device) and value.type == "cuda":
            device = value
        elif isinstance(value, str) and value.split(":", 1)[0] == "cuda":
            device = torch.device(value)
        if device is None:
            return value
        index = self.cuda.current if device.index is None else device.index
        self.cuda.touch(index)
        self.cuda.work_devices.append(index)
        return torch.device("cpu")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.device:  # constructing a device object is not sending work to it
            return func(*args, **kwargs)
        if func in (torch.Tensor.cuda,):
            device = args[1] if len(args) > 1 else kwargs.get("device")
            self._redirect(torch.device("cuda", device) if isinstance(device, int) else device or torch.device("cuda"))
            return args[0]
        if func in (torch.Tensor.pin_memory,):
            return args[0]
        args = tuple(self._redirect(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = self._redirect(kwargs["device"])
        return func(*args, **kwargs)


# --- NVML: a fake libnvidia-ml under the real pynvml -----------------------------------------------

_SUCCESS = pynvml.NVML_SUCCESS
_INVALID = pynvml.NVML_ERROR_INVALID_ARGUMENT
_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
_INSUFFICIENT = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
_UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
MAX_MIG = 7
HOST_PID_OFFSET = 3_000_000  # a PID the container's namespace never shows


class FakeNvmlLib:
    """The C functions pynvml looks up by name, taking the ctypes arguments it passes."""

    def __init__(self, machine: FakeMachine, cuda: FakeCuda) -> None:
        self.machine, self.cuda = machine, cuda
        self.initialized = False
        self._handles: dict[int, Unit] = {}
        self._structs: list[Any] = []
        self.calls: list[str] = []
        self.started = time.perf_counter()

    def __getattr__(self, name: str) -> Callable[..., int]:
        method = getattr(type(self), f"_{name}", None)
        if method is None:
            raise AttributeError(name)  # pynvml: NVMLError_FunctionNotFound

        def c_function(*args: Any) -> Any:  # a plain function: pynvml may set .restype on it
            self.calls.append(name)
            if name not in ("nvmlInitWithFlags", "nvmlInit_v2", "nvmlErrorString") and not self.initialized:
                return _UNINITIALIZED
            return method(self, *args)

        self.__dict__[name] = c_function
        return c_function

    # handles
    def _handle_for(self, unit: Unit) -> int:
        for address, known in self._handles.items():
            if known.uuid == unit.uuid:
                return address
        struct = pynvml.struct_c_nvmlDevice_t()
        self._structs.append(struct)
        address = ctypes.addressof(struct)
        self._handles[address] = unit
        return address

    @staticmethod
    def _write_handle(out: Any, address: int) -> None:
        pointer = out._obj  # byref(c_nvmlDevice_t()) -> the pointer object
        ctypes.cast(ctypes.pointer(pointer), ctypes.POINTER(ctypes.c_void_p)).contents.value = address

    def _unit(self, handle: Any) -> Unit | None:
        try:
            address = ctypes.cast(handle, ctypes.c_void_p).value
        except (TypeError, ctypes.ArgumentError):
            return None
        return self._handles.get(address)

    @staticmethod
    def _write_text(buffer: Any, size: Any, value: str) -> int:
        data = value.encode()
        if len(data) + 1 > size.value:
            return _INSUFFICIENT
        buffer.value = data
        return _SUCCESS

    # the library
    def _nvmlInitWithFlags(self, flags: int) -> int:
        self.initialized = True
        return _SUCCESS

    def _nvmlShutdown(self) -> int:
        self.initialized = False
        return _SUCCESS

    def _nvmlErrorString(self, code: int) -> bytes:
        return f"fake NVML error {code}".encode()

    def _nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> int:
        return self._write_text(buffer, size, self.machine.driver)

    def _nvmlSystemGetNVMLVersion(self, buffer: Any, size: Any) -> int:
        return self._write_text(buffer, size, self.machine.nvml_version)

    def _nvmlSystemGetCudaDriverVersion(self, out: Any) -> int:
        out._obj.value = self.machine.cuda_driver
        return _SUCCESS

    def _nvmlDeviceGetCount_v2(self, out: Any) -> int:
        out._obj.value = len(self.machine.gpus)
        return _SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        i = index.value
        if not 0 <= i < len(self.machine.gpus):
            return _INVALID
        self._write_handle(out, self._handle_for(Unit(self.machine.gpus[i])))
        return _SUCCESS

    def _nvmlDeviceGetHandleByUUID(self, uuid: Any, out: Any) -> int:
        text = uuid.value.decode() if isinstance(uuid, ctypes.c_char_p) else bytes(uuid).decode()
        for gpu in self.machine.gpus:
            if gpu.uuid == text:
                self._write_handle(out, self._handle_for(Unit(gpu)))
                return _SUCCESS
        return _NOT_FOUND

    def _nvmlDeviceGetUUID(self, handle: Any, buffer: Any, size: Any) -> int:
        unit = self._unit(handle)
        return _INVALID if unit is None else self._write_text(buffer, size, unit.uuid)

    def _nvmlDeviceGetName(self, handle: Any, buffer: Any, size: Any) -> int:
        unit = self._unit(handle)
        return _INVALID if unit is None else self._write_text(buffer, size, unit.name)

    def _nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        unit = self._unit(handle)
        if unit is None:
            return _INVALID
        if unit.mig is not None:
            return _NOT_SUPPORTED  # asked of the MIG instance: ask its GPU
        major._obj.value, minor._obj.value = unit.gpu.capability
        return _SUCCESS

    def _used(self, unit: Unit) -> int:
        own = 0
        index = self.cuda.index_of(unit.uuid)
        if index is not None:
            own = self.cuda.own_bytes(index)
        return unit.others_used + own

    def _nvmlDeviceGetMemoryInfo(self, handle: Any, out: Any) -> int:
        unit = self._unit(handle)
        if unit is None:
            return _INVALID
        memory = out._obj
        memory.total, memory.used = unit.memory, self._used(unit)
        memory.free = unit.memory - memory.used
        return _SUCCESS

    def _nvmlDeviceGetMemoryInfo_v2(self, handle: Any, out: Any) -> int:
        unit = self._unit(handle)
        if unit is None:
            return _INVALID
        memory = out._obj
        if memory.version != pynvml.nvmlMemory_v2:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        memory.total, memory.reserved, memory.used = unit.memory, 0, self._used(unit)
        memory.free = unit.memory - memory.used
        return _SUCCESS

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, procs: Any) -> int:
        unit = self._unit(handle)
        if unit is None:
            return _INVALID
        entries = []
        index = self.cuda.index_of(unit.uuid)
        if index is not None and index in self.cuda.contexts:
            pid = os.getpid() + HOST_PID_OFFSET if self.machine.container else os.getpid()
            entries.append((pid, self.cuda.own_bytes(index)))
        if unit.others_used:
            entries.append((4242 + HOST_PID_OFFSET, unit.others_used))
        if procs is None:
            if not entries:
                count._obj.value = 0
                return _SUCCESS
            count._obj.value = len(entries)
            return _INSUFFICIENT
        if count._obj.value < len(entries):
            count._obj.value = len(entries)
            return _INSUFFICIENT
        for slot, (pid, used) in zip(procs, entries):
            slot.pid, slot.usedGpuMemory = pid, used
            slot.gpuInstanceId = unit.mig.gpu_instance if unit.mig else 0xFFFFFFFF
            slot.computeInstanceId = unit.mig.compute_instance if unit.mig else 0xFFFFFFFF
        count._obj.value = len(entries)
        return _SUCCESS

    def _nvmlDeviceGetUtilizationRates(self, handle: Any, out: Any) -> int:
        unit = self._unit(handle)
        if unit is None:
            return _INVALID
        if unit.mig is not None:
            return _NOT_SUPPORTED
        out._obj.gpu, out._obj.memory = unit.gpu.utilization, 40
        return _SUCCESS

    def _nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, out: Any) -> int:
        """Millijoules since the driver loaded (here: since the fake did), at the GPU's power.
        A MIG instance's handle, and a GPU without the counter, answer NOT_SUPPORTED, as NVML
        does; pynvml turns that into NVMLError_NotSupported."""
        unit = self._unit(handle)
        if unit is None or not isinstance(getattr(out, "_obj", None), ctypes.c_ulonglong):
            return _INVALID
        if unit.mig is not None or not unit.gpu.energy_counter:
            return _NOT_SUPPORTED
        out._obj.value = int(unit.gpu.power_w * (time.perf_counter() - self.started) * 1000)
        return _SUCCESS

    def _nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        unit = self._unit(handle)
        if unit is None or unit.mig is not None:
            return _INVALID
        if not unit.gpu.mig_capable:
            return _NOT_SUPPORTED
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if unit.gpu.migs is not None else pynvml.NVML_DEVICE_MIG_DISABLE
        current._obj.value = pending._obj.value = mode
        return _SUCCESS

    def _nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, out: Any) -> int:
        unit = self._unit(handle)
        if unit is None or unit.mig is not None:
            return _INVALID
        if not unit.gpu.mig_capable:
            return _NOT_SUPPORTED
        out._obj.value = MAX_MIG
        return _SUCCESS

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> int:
        unit = self._unit(handle)
        if unit is None or unit.mig is not None or unit.gpu.migs is None or not 0 <= index.value < MAX_MIG:
            return _INVALID
        if index.value >= len(unit.gpu.migs):
            return _NOT_FOUND
        self._write_handle(out, self._handle_for(Unit(unit.gpu, unit.gpu.migs[index.value])))
        return _SUCCESS

    def _nvmlDeviceIsMigDeviceHandle(self, handle: Any, out: Any) -> int:
        unit = self._unit(handle)
        if unit is None:
            return _INVALID
        out._obj.value = int(unit.mig is not None)
        return _SUCCESS

    def _nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, out: Any) -> int:
        unit = self._unit(handle)
        if unit is None or unit.mig is None:
            return _INVALID
        self._write_handle(out, self._handle_for(Unit(unit.gpu)))
        return _SUCCESS

    def _nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> int:
        unit = self._unit(handle)
        if unit is None or unit.mig is None:
            return _INVALID
        out._obj.value = unit.mig.gpu_instance
        return _SUCCESS

    def _nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> int:
        unit = self._unit(handle)
        if unit is None or unit.mig is None:
            return _INVALID
        out._obj.value = unit.mig.compute_instance
        return _SUCCESS


# --- installing ---------------------------------------------------------------------------------

_real_gpu: list[str | None] = []  # the answer, once: asked before any fake is installed


def real_gpu_reason() -> str | None:
    """Why the fakes cannot run here, or None: a real GPU that this torch sees (a CUDA build on a
    GPU machine). The fakes replace torch.cuda's entry points one by one; beside a live CUDA, a
    path they miss reaches the real device, and what the test measures is neither. Asked first
    before any fake is installed (a test's are undone after it), so it is torch's own answer."""
    if not _real_gpu:
        real = torch.cuda.is_available()
        name = torch.cuda.get_device_name(0) if real else None
        _real_gpu.append(f"a real GPU is visible ({name}, torch {torch.__version__}): the fakes' tests run without one")
        if not real:
            _real_gpu[0] = None
    return _real_gpu[0]


class _FakeGenerator:
    """A CUDA generator (Philox): its state is 16 bytes, the seed and the offset."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.state = torch.zeros(16, dtype=torch.uint8)

    def manual_seed(self, seed: int) -> "_FakeGenerator":
        if not isinstance(seed, int):
            raise TypeError(f"manual_seed expected an int, got {type(seed).__name__}")
        self.cuda.seeds.append(seed)
        self.state = torch.tensor(list((seed % 2**64).to_bytes(8, "little")) + [0] * 8, dtype=torch.uint8)
        return self

    def get_state(self) -> torch.Tensor:  # torch.cuda.get_rng_state (dynamo saves it around a compile)
        return self.state.clone()

    def set_state(self, state: torch.Tensor) -> "_FakeGenerator":
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise TypeError("expected a torch.ByteTensor, but got " + type(state).__name__)
        if state.numel() != 16:
            raise RuntimeError("RNG state is wrong size")
        self.state = state.clone()
        return self


# torch._C's CUDA entry points the fakes do not replace, by prefix: on a CUDA build they reach
# the real driver (a GPU machine's, or none), so under the fakes each one refuses to run, and a
# path that needs one shows up here (on the CPU build too) instead of on a GPU. The accelerator
# ones that do not touch a device stay: which accelerator this build has, the allocator settings.
_REAL_CUDA_PREFIXES = ("_cuda_", "_accelerator_")
_HARMLESS = {"_accelerator_getAccelerator", "_accelerator_getAllocatorSettings", "_accelerator_setAllocatorSettings"}


def _leak(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a real CUDA call leaked through the fakes: torch._C.{name} (fake it here)")

    return refuse


def _replace_c_functions(fakes: dict[str, Callable[..., Any]], setattr_: Callable[..., None]) -> None:
    """torch._C's CUDA entry points: the fakes where given, a refusal for the others, in torch._C
    and wherever torch bound one by name at import (torch.cuda.graphs binds
    _cuda_isCurrentStreamCapturing, which the optimizer's step reaches)."""
    replacements = dict(fakes)
    for name in dir(torch._C):
        value = getattr(torch._C, name)
        if name.startswith(_REAL_CUDA_PREFIXES) and name not in fakes and name not in _HARMLESS:
            if callable(value) and not isinstance(value, type):
                replacements[name] = _leak(name)
    originals = {name: getattr(torch._C, name, None) for name in replacements}
    for name, function in replacements.items():
        setattr_(torch._C, name, function, raising=False)
    for module in [m for n, m in list(sys.modules.items()) if n.startswith("torch.") and m is not None]:
        names = vars(module)
        for name, function in replacements.items():
            if originals[name] is not None and names.get(name) is originals[name]:
                setattr_(module, name, function)


def install(machine: FakeMachine, setattr_: Callable[..., None]) -> FakeCuda:
    """Replace NVML and torch.cuda with the fakes of `machine`; `setattr_` is
    monkeypatch.setattr in a test (undone after it), a plain setter in a child process.
    Returns the process's CUDA state; the caller enters `CudaOnCpu(cuda)` for tensors."""
    import torch._dynamo  # noqa: F401  (before the fakes: it binds CUDA entry points at import)

    import autotune.device.info
    import autotune.device.nvml

    if (why := real_gpu_reason()) is not None:  # a test using the fakes is marked cuda_fakes (skipped)
        raise RuntimeError(f"the CUDA fakes cannot be installed: {why}")

    cuda = FakeCuda(machine)
    lib = FakeNvmlLib(machine, cuda)
    setattr_(pynvml, "nvmlLib", lib if machine.nvml else None)  # None: pynvml looks for the real library
    setattr_(pynvml, "_nvmlGetFunctionPointer_cache", {})
    setattr_(autotune.device.nvml, "_nvml_state", {"ok": None})
    setattr_(autotune.device.info, "_order_warned", [], raising=False)
    c_functions = {
        "_cuda_getDeviceCount": cuda.c_get_device_count,
        "_cuda_setDevice": cuda.c_set_device,
        "_cuda_getDevice": cuda.c_get_device,
        "_accelerator_setDeviceIndex": cuda.c_accelerator_set_device_index,
        "_cuda_synchronize": cuda.c_synchronize,
        "_cuda_resetPeakMemoryStats": cuda.c_reset_peak_memory_stats,
        "_cuda_memoryStats": cuda.c_memory_stats,
        "_cuda_setMemoryFraction": cuda.c_set_memory_fraction,
        "_cuda_emptyCache": cuda.c_empty_cache,
        "_cuda_isCurrentStreamCapturing": lambda: False,  # the optimizer's step asks; no graph is captured
    }
    _replace_c_functions(c_functions, setattr_)
    for module in (torch.cuda, torch.cuda.memory):
        setattr_(module, "_lazy_init", cuda.lazy_init)
        setattr_(module, "is_initialized", cuda.is_initialized)
    setattr_(torch.cuda, "_is_in_bad_fork", cuda.is_in_bad_fork)
    # torch.cuda.device_count asks libnvidia-ml itself (not pynvml) before the C call, and caches
    # the answer: on a GPU machine that would be the real count.
    setattr_(torch.cuda, "_device_count_nvml", lambda: -1, raising=False)
    setattr_(torch.cuda, "_cached_device_count", None, raising=False)
    setattr_(torch.cuda, "_exchange_device", cuda.exchange_device)
    setattr_(torch.cuda, "_maybe_exchange_device", cuda.exchange_device)
    setattr_(torch.cuda, "_get_device_properties", cuda.get_device_properties, raising=False)
    setattr_(torch.cuda, "current_stream", cuda.current_stream)
    setattr_(torch.cuda, "Event", make_event_class(cuda))
    setattr_(torch.cuda, "cudart", lambda: SimpleNamespace(cudaMemGetInfo=cuda.mem_get_info))
    setattr_(torch.cuda, "default_generators", tuple(_FakeGenerator(cuda) for _ in machine.gpus))
    setattr_(torch.version, "cuda", "12.8")
    return cuda


def child_env(machine: FakeMachine, tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment in which every Python process (a trial, a --devices worker) starts
    with this machine's fakes installed and `CudaOnCpu` active; all but multiprocessing's
    resource tracker, which only unlinks semaphores and shared memory: a fork server's tuner
    starts one, and installing the fakes there imports torch (seconds of CPU) for nothing."""
    site = tmp_path / "fake_gpu_site"
    site.mkdir(exist_ok=True)
    lines = [
        "import sys",
        "if not any('multiprocessing.resource_tracker' in arg for arg in sys.orig_argv):",
        f"    sys.path.insert(0, {str(ROOT)!r})",
        "    from tests.cuda_fakes import install_from_env",
        "    install_from_env()",
    ]
    (site / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # The fakes install as an interpreter starts (sitecustomize). A test that runs trials from its
    # own process may find a fork server (trial.fork_server) that an earlier test started without
    # them, so trials start as fresh interpreters; a fresh tuner process can fork them instead
    # (AUTOTUNE_TRIAL_START="fork" in `extra`): its server starts with the fakes too.
    start = {"AUTOTUNE_TRIAL_START": "exec"}
    return {**os.environ, "PYTHONPATH": path, FAKE_ENV: machine.to_json(), **start, **extra}


def install_from_env() -> None:
    """sitecustomize's entry point: the fakes for the rest of this process's life."""
    text = os.environ.get(FAKE_ENV)
    if not text:
        return

    def setter(target: Any, name: str, value: Any, raising: bool = True) -> None:
        setattr(target, name, value)

    cuda = install(FakeMachine.from_json(text), setter)
    mode = CudaOnCpu(cuda)
    mode.__enter__()
    sys.modules[__name__].PROCESS_CUDA = cuda  # for a test that looks inside the child


@contextlib.contextmanager
def fake_gpu_machine(monkeypatch, machine: FakeMachine | None = None, *, visible: str | None = None):
    """A test's fake CUDA machine: NVML and torch.cuda replaced, tensors for "cuda:N" on the
    CPU, CUDA_VISIBLE_DEVICES as given and CUDA_DEVICE_ORDER unset (both restored after)."""
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    cuda = install(machine or FakeMachine(), monkeypatch.setattr)
    with CudaOnCpu(cuda):
        yield cuda
