"""`autotune doctor`: can this machine run a study, and what will it measure?

In a few seconds, in this process (one CUDA context, no trial):

    versions     torch, its CUDA, the driver and its CUDA, NVML, triton, Python, autotune
    device       the GPU (or CPU), its memory, MIG mode, and the PID check: a CUDA context is
                 made, then NVML is asked which PIDs compute on the device. Ours listed: the
                 host's PID namespace, peak memory from NVML's per-process figure. Others
                 listed but not ours: a container, the device-level figure minus a baseline.
                 The source the measurements will use is then said (`device.gpu_memory`).
    compile      a tiny torch.compile on the device, after checking what it needs: a C
                 compiler and Python's headers (inductor builds its launchers with them at run
                 time), and triton on CUDA. Without them every compiled trial would crash.
    sdpa         which attention backends run forward and backward, in bfloat16 and float16,
                 at GPT-2's shape (12 heads of 64, 1024 positions, causal)
    peak FLOPs   what MFU divides by on this device, per dtype, and the source
    matmul       what a large matmul reaches here (bfloat16 on CUDA, float32 on a CPU), timed:
                 the practical ceiling beside the datasheet's, and beside the figure measured
                 on a real card of this kind where one is known (`device.flops`)

Every check is reported, none raises: a machine that fails one is told which and why."""

from __future__ import annotations

import os
import platform
import random
import shutil
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from autotune.device import (
    DeviceInfo,
    compute_process_pids,
    describe,
    load_nvml,
    peak_flops,
    peak_flops_entry,
    physical_gpus,
    resolve_device,
)
from autotune.device.flops import measured_peak_flops
from autotune.device.gpu_memory import GpuMemoryWatch
from autotune.device.info import busy_host, software_versions
from autotune.device.nvml import text
from autotune.errors import UsageError
from autotune.measure.cuda import ALLOCATOR_RESERVED, RSS

SDPA_SHAPE = (1, 12, 1024, 64)  # (B, heads, T, head dim) of GPT-2 at its full context
SDPA_SHAPE_CPU = (1, 2, 1024, 64)  # the same kernels, fewer heads: seconds less on a few cores
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
SDPA_DTYPES = ("bfloat16", "float16")
SDPA_RUNS = "runs"  # a backend's entry when it ran; otherwise the reason it did not
# The timed matmul: square, large enough that cuBLAS runs its best tiles (8192: 1.1 TFLOP a
# product, about 1.4 ms on an H200); a CPU's is smaller, in float32 (no bf16 units on most):
# 0.27 GFLOP a product, tens of ms on a few cores.
MATMUL_SIZE = {"cuda": 8192, "cpu": 512}
MATMUL_DTYPE = {"cuda": "bfloat16", "cpu": "float32"}
MATMUL_RUNS = {"cuda": 20, "cpu": 5}  # timed products, after 3 untimed ones


@dataclass
class Check:
    ok: bool
    detail: str
    seconds: float = 0.0


@dataclass
class DoctorReport:
    versions: dict[str, str | None]
    device: dict[str, Any]
    memory: dict[str, Any]
    compile: Check
    sdpa: dict[str, dict[str, str]]  # dtype -> backend -> SDPA_RUNS, or why not
    peak_flops: dict[str, Any]
    matmul: dict[str, Any]  # dtype, size, flops_per_sec (null when it failed: detail), and the references
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what would not fail a study, but skews it: a busy host

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def run_doctor(device: str = "auto") -> DoctorReport:
    problems: list[str] = []
    versions = _versions()
    try:
        name = resolve_device(device)
        info = describe(name)
    except UsageError as exc:  # MIG handed whole, a missing index: say it, check the CPU side
        problems.append(str(exc))
        name, info = "cpu", describe("cpu")
    memory = _memory_check(name, info)
    compile_check = check_compile(name, info)
    if not compile_check.ok:
        problems.append(f"torch.compile cannot run here ({compile_check.detail}): every compiled trial would crash")
    flops = peak_flops_entry(info.name) if info.kind == "cuda" else None
    return DoctorReport(
        versions=versions,
        device={**info.to_dict(), "device": name, "mig": _mig_mode(info)},
        memory=memory,
        compile=compile_check,
        sdpa=check_sdpa(name, info),
        peak_flops={
            "by_dtype": flops.by_dtype if flops else None,
            "source": flops.source if flops else "a CPU: MFU is not reported",
        },
        matmul=check_matmul(name, info),
        problems=problems,
        warnings=[note] if (note := busy_host()) else [],
    )


# --- versions --------------------------------------------------------------------------------


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {
        **software_versions(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "driver": None,
        "driver_cuda": None,
        "nvml": None,
        "triton": _triton_version(),
        "os": platform.platform(),
    }
    pynvml = load_nvml()
    if pynvml is not None:
        try:
            out["driver"] = text(pynvml.nvmlSystemGetDriverVersion())
            out["nvml"] = text(pynvml.nvmlSystemGetNVMLVersion())
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            out["driver_cuda"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except pynvml.NVMLError:
            pass
    return out


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


# --- the device -------------------------------------------------------------------------------


def _mig_mode(info: DeviceInfo) -> str:
    if info.kind != "cuda":
        return "n/a"
    if info.uuid and info.uuid.startswith("MIG-"):
        return "a MIG instance"
    gpus = physical_gpus() or []
    parent = next((g for g in gpus if g.uuid == info.uuid), None)
    if parent is None:
        return "unknown (no NVML)"
    return "enabled" if parent.mig is not None else "disabled"


def _memory_check(device: str, info: DeviceInfo) -> dict[str, Any]:
    """Start CUDA here, as a trial does, and see which peak-memory figure will be read."""
    if info.kind != "cuda":
        return {"source": RSS, "detail": "the CPU: peak resident memory (RSS) of the trial process"}
    watch = GpuMemoryWatch(info.uuid)
    watch.take_baseline(cuda_started=torch.cuda.is_initialized())
    index = int(device.split(":")[1])
    torch.cuda.set_device(index)
    probe = torch.ones(1024, device=device)  # a context and one allocator segment
    torch.cuda.synchronize(index)
    watch.sample()
    pids = compute_process_pids(watch.handle)
    reading = watch.peak()
    del probe
    in_container = None if not pids else os.getpid() not in pids
    if reading is None:
        return {
            "source": ALLOCATOR_RESERVED,
            "in_container": in_container,
            "nvml_pids": pids,
            "detail": "NVML cannot see this process's memory: torch's reserved peak, which misses the CUDA context",
        }
    own, source = reading
    if not in_container:
        detail = f"NVML lists this process (PID {os.getpid()}): its per-process figure"
    else:
        detail = (
            f"NVML lists PIDs {pids} but not ours ({os.getpid()}): a container's PID namespace; the device's used "
            "memory minus a baseline read before CUDA starts (valid while the trial is alone on the GPU)"
        )
    return {"source": source, "in_container": in_container, "context_bytes": own, "nvml_pids": pids, "detail": detail}


# --- compile ----------------------------------------------------------------------------------


def compile_prerequisites(kind: str) -> str | None:
    """What torch.compile needs at run time that is missing here, or None."""
    compiler = os.environ.get("CC") or next((c for c in ("gcc", "cc", "clang") if shutil.which(c)), None)
    if compiler is None or shutil.which(compiler) is None:
        return "no C compiler (gcc, cc or clang, or $CC): install one (apt install gcc)"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"no Python headers ({headers} is missing): install them (apt install python3-dev)"
    if kind == "cuda" and _triton_version() is None:
        return "triton is not installed (it ships with CUDA builds of torch)"
    return None


def check_compile(device: str, info: DeviceInfo) -> Check:
    """Compile a tiny function, new each run, and run it on the device. New means a kernel no
    cache holds, so the compiler and headers are really used: its random constant is a literal
    of a code object made now. (A constant from a closure is a graph input to dynamo, floats
    being unspecialized: the same kernel every run, which inductor's caches answered.)"""
    started = time.perf_counter()
    missing = compile_prerequisites(info.kind)
    if missing is not None:
        return Check(False, missing, time.perf_counter() - started)
    # From the OS, not the process's generator: a seeded process (a test, a notebook) would draw
    # the same constant again, and a cache would answer.
    tiny = _new_function(random.SystemRandom().uniform(1.0, 2.0))
    try:
        x = torch.randn(256, device=device)
        torch.testing.assert_close(torch.compile(tiny)(x), tiny(x))
    except Exception as exc:  # noqa: BLE001 (any failure means compiled trials would fail too)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return Check(False, f"{type(exc).__name__}: {first}", time.perf_counter() - started)
    return Check(True, "a tiny function compiled and ran", time.perf_counter() - started)


def _new_function(scale: float) -> Any:
    """`torch.sin(x) * scale + 1.0`, with `scale` written into a code object of its own."""
    namespace: dict[str, Any] = {"torch": torch}
    source = f"def tiny(x):\n    return torch.sin(x) * {scale!r} + 1.0\n"
    exec(compile(source, f"<autotune doctor {scale!r}>", "exec"), namespace)  # our own two lines, a float in them
    return namespace["tiny"]


# --- a large matmul ------------------------------------------------------------------------------


def check_matmul(device: str, info: DeviceInfo) -> dict[str, Any]:
    """FLOP/s of a large square matmul here, with the datasheet's peak and a real card's
    measured figure for the same dtype where known (what MFU's two figures divide by)."""
    size, dtype = MATMUL_SIZE[info.kind], MATMUL_DTYPE[info.kind]
    result: dict[str, Any] = {"dtype": dtype, "size": size, "flops_per_sec": None, "detail": None}
    if info.kind == "cuda":
        known = measured_peak_flops(info.name, dtype)
        result["datasheet_flops_per_sec"] = peak_flops(info.name, dtype)
        result["measured_elsewhere_flops_per_sec"] = known[0] if known else None
        result["measured_elsewhere_source"] = known[1] if known else None
    try:
        a = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
        b = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
        for _ in range(3):  # cuBLAS picks its kernel, clocks ramp up
            a @ b
        _synchronize(info)
        started = time.perf_counter()
        for _ in range(MATMUL_RUNS[info.kind]):
            a @ b
        _synchronize(info)
        result["flops_per_sec"] = 2 * size**3 * MATMUL_RUNS[info.kind] / (time.perf_counter() - started)
    except Exception as exc:  # noqa: BLE001 (the reason is the answer)
        result["detail"] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return result


def _synchronize(info: DeviceInfo) -> None:
    if info.kind == "cuda":
        torch.cuda.synchronize()


# --- attention ----------------------------------------------------------------------------------


def check_sdpa(device: str, info: DeviceInfo) -> dict[str, dict[str, str]]:
    """Which forced SDPA backends run (forward and backward) per dtype at GPT-2's shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from autotune.config import SDPA_KERNELS

    result: dict[str, dict[str, str]] = {}
    for dtype in SDPA_DTYPES:
        result[dtype] = {}
        for backend in SDPA_BACKENDS:
            if info.kind != "cuda" and backend in ("efficient", "cudnn"):
                result[dtype][backend] = "a CUDA kernel"
                continue
            try:
                shape = SDPA_SHAPE if info.kind == "cuda" else SDPA_SHAPE_CPU
                q = torch.randn(shape, device=device, dtype=getattr(torch, dtype), requires_grad=True)
                with sdpa_kernel([getattr(SDPBackend, SDPA_KERNELS[backend])]):
                    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
                out.sum().backward()
                result[dtype][backend] = SDPA_RUNS
            except Exception as exc:  # noqa: BLE001 (the backend's reason is the answer)
                result[dtype][backend] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    if info.kind == "cuda":
        torch.cuda.synchronize()
    return result
