"""The rules for what a device can run, and what a model can run, checked before anything
runs. Torch-free: the study side reads the device rules without importing torch."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from autotune import registry
from autotune.config import GenerateConfig, TrainConfig
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


def check_supported(cfg: TrainConfig | GenerateConfig, caps: DeviceCapabilities) -> None:
    """Reject, before anything runs, what this device cannot run; the reason names the knob.
    Each knob's rule is its registry entry's `device_rule`. Rules that can only be known by
    trying (a kernel for an exotic shape) surface at run time, classified by
    `autotune.measure.outcomes`."""
    values = cfg.to_dict()
    for knob in registry.knobs_of(cfg.TASK):  # a TrainConfig's, or a GenerateConfig's
        if knob.device_rule is not None and (why := knob.device_rule(values, caps)) is not None:
            raise UnsupportedConfig(knob.name, why)


# ------------------------------------------------------------------ what a model can run
# Duck-typed on the model object (no torch import): autotune's GPT has every seam the rules look
# for; a user's model has them only if it is written to. Checked before any knob is applied, so
# a configuration the model cannot take fails whole, as `unsupported`, before anything runs.


def check_model_supported(model: Any, cfg: TrainConfig | GenerateConfig) -> None:
    """Reject the knobs that need a seam `model` lacks; the reason names the seam."""
    values = cfg.to_dict()
    for knob in registry.knobs_of(cfg.TASK):
        if knob.model_rule is not None and (why := knob.model_rule(model, values)) is not None:
            raise UnsupportedConfig(knob.name, why)


def check_head_found(model: Any) -> None:
    if not registry.has_head(model):
        raise UnsupportedConfig("compile_scope", registry.head_missing(model))


takes_document_ids = registry.takes_document_ids
