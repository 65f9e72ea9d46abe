"""The rules for what a device can run, checked before anything runs."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from autotune.config import TrainConfig
from autotune.errors import UnsupportedConfig


@dataclass(frozen=True)
class DeviceCapabilities:
    """What the support rules need to know of a device, readable without initializing CUDA."""

    kind: str  # "cpu" or "cuda"
    compute_capability: tuple[int, int] | None = None  # CUDA only, e.g. (9, 0)
    has_triton: bool = True  # torch.compile's CUDA backend

    @classmethod
    def detect(cls, kind: str, compute_capability: tuple[int, int] | None) -> "DeviceCapabilities":
        return cls(kind, compute_capability, importlib.util.find_spec("triton") is not None)


def check_supported(cfg: TrainConfig, caps: DeviceCapabilities) -> None:
    """Reject, before anything runs, what this device cannot run; the reason names the knob.
    Rules that can only be known by trying (a kernel for an exotic shape) surface at run time,
    classified by `autotune.measure.outcomes`."""
    if caps.kind == "cpu":
        _check_cpu(cfg)
    else:
        _check_cuda(cfg, caps)


def _check_cpu(cfg: TrainConfig) -> None:
    if cfg.pin_memory:
        raise UnsupportedConfig("pin_memory", "pinned memory only speeds host-to-GPU copies; there is no GPU")
    if cfg.amp_dtype == "tf32":
        raise UnsupportedConfig("amp_dtype", "tf32 is a CUDA tensor-core format; CPUs have none")
    if cfg.sdpa_backend in ("efficient", "cudnn"):
        raise UnsupportedConfig(
            "sdpa_backend", f"{cfg.sdpa_backend} attention is a CUDA kernel; on CPU use math or flash"
        )
    if cfg.compile_mode == "reduce-overhead":
        raise UnsupportedConfig("compile_mode", "reduce-overhead means CUDA graphs, which need a CUDA device")


def _check_cuda(cfg: TrainConfig, caps: DeviceCapabilities) -> None:
    major = caps.compute_capability[0] if caps.compute_capability else 0
    if cfg.amp_dtype in ("bfloat16", "tf32") and major < 8:
        raise UnsupportedConfig("amp_dtype", f"{cfg.amp_dtype} needs compute capability 8.0 or newer (Ampere)")
    if cfg.sdpa_backend in ("flash", "cudnn"):
        if cfg.amp_dtype not in ("float16", "bfloat16"):
            raise UnsupportedConfig(
                "sdpa_backend", f"{cfg.sdpa_backend} attention needs float16 or bfloat16, not {cfg.amp_dtype}"
            )
        if major < 8:
            raise UnsupportedConfig(
                "sdpa_backend", f"{cfg.sdpa_backend} attention needs compute capability 8.0 or newer"
            )
    if cfg.compile_mode != "none" and not caps.has_triton:
        raise UnsupportedConfig("compile_mode", "torch.compile on CUDA needs triton, which is not installed")
