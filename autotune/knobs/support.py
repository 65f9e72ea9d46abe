"""The rules for what a device can run, and what a model can run, checked before anything
runs. Torch-free: the study side reads the device rules without importing torch."""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.errors import UnsupportedConfig


@dataclass(frozen=True)
class DeviceCapabilities:
    """What the support rules need to know of a device, readable without initializing CUDA."""

    kind: str  # "cpu" or "cuda"
    compute_capability: tuple[int, int] | None = None  # CUDA only, e.g. (9, 0)
    has_triton: bool = True  # torch.compile's CUDA backend
    # A CPU with bf16 instructions. Without them torch runs bf16 by converting to float32 and
    # back around every op: slower than float32 itself (1.5-2.4x on the CPU sweep's 4096-token
    # steps, 10x on gpt2-tiny's 1024-token steps, both on an AVX2 EPYC). CUDA devices: the rule
    # is compute capability 8.0 (check_supported).
    cpu_bf16: bool = True

    @classmethod
    def detect(cls, kind: str, compute_capability: tuple[int, int] | None) -> "DeviceCapabilities":
        cpu_bf16 = kind != "cpu" or cpu_has_bf16(_read_cpuinfo()) is not False
        return cls(kind, compute_capability, importlib.util.find_spec("triton") is not None, cpu_bf16)


# /proc/cpuinfo's names for bf16 arithmetic: x86's AVX512-BF16 and AMX-BF16 ("flags"), Arm's
# BF16 extension ("Features", Neoverse V1/N2 and later).
_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


def cpu_has_bf16(cpuinfo: str | None) -> bool | None:
    """Whether the CPU that `cpuinfo` (the text of /proc/cpuinfo) describes has bf16
    instructions; None when it names no instruction set at all (another OS, a sandbox)."""
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return not _BF16_FLAGS.isdisjoint(value.split())
    return None


def _read_cpuinfo() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


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
    if cfg.attention_mask == "document":
        raise UnsupportedConfig(
            "attention_mask",
            "document masks run on FlexAttention, which has no backward on CPU in torch 2.13 "
            "(and torch's variable-length attention is CUDA-only): they train on CUDA",
        )
    if cfg.expandable_segments:
        raise UnsupportedConfig(
            "expandable_segments", "a setting of the CUDA caching allocator; CPU tensors do not use it"
        )


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
    if cfg.attention_mask == "document" and not caps.has_triton:
        raise UnsupportedConfig(
            "attention_mask", "document masks run on FlexAttention, compiled with triton, which is not installed"
        )


# ------------------------------------------------------------------ what a model can run
# Duck-typed on the model object (no torch import): autotune's GPT has every seam below; a
# user's model has them only if it is written to. Checked before any knob is applied, so a
# configuration the model cannot take fails whole, as `unsupported`, before anything runs.


def check_model_supported(model: Any, cfg: TrainConfig) -> None:
    """Reject the knobs that need a seam `model` lacks; the reason names the seam."""
    if cfg.compile_mode != "none" and cfg.compile_scope == "blocks+head":
        check_head_found(model)
    if cfg.loss_impl == "chunked" and not callable(getattr(model, "linear_cross_entropy", None)):
        raise UnsupportedConfig(
            "loss_impl",
            f"chunked needs the model to compute its loss through a linear_cross_entropy(hidden, weight, "
            f"labels) attribute that autotune can replace (autotune's GPT does); {type(model).__name__} "
            "computes its loss itself",
        )
    if cfg.attention_mask == "document" and not takes_document_ids(model):
        raise UnsupportedConfig(
            "attention_mask",
            f"document needs a model whose forward takes document_ids (autotune's GPT does); "
            f"{type(model).__name__}.forward does not",
        )


def check_head_found(model: Any) -> None:
    if not callable(getattr(model, "head_loss", None)):
        raise UnsupportedConfig(
            "compile_scope",
            f"blocks+head cannot find the head of {type(model).__name__}: it compiles a head_loss(hidden, "
            "labels) method (final norm, output projection and loss; autotune's GPT has one); "
            "use compile_scope=blocks or model",
        )


def takes_document_ids(model: Any) -> bool:
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return "document_ids" in parameters
