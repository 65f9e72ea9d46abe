"""The peak-FLOPs table that MFU divides by, in one place, each entry with its source; beside it, the
cards the project knows (`CARDS`), for planning on a card this machine does not have."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.device.info import DeviceInfo

# Dense (no sparsity) peak FLOP/s by device name fragment and compute dtype, as NVML and
# torch name the cards ("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H100 80GB HBM3"). Each entry
# cites its source; datasheets give tensor-core figures "with sparsity", halved here. Order
# matters: the first fragment found in the device name wins, so the NVL and PCIe cards (lower
# clocks and power) come before the SXM entry their names also contain.
PEAK_FLOPS: list[tuple[str, dict[str, float], str]] = [
    (
        "H200 NVL",
        {"bfloat16": 835.5e12, "float16": 835.5e12, "tf32": 417.5e12, "float32": 60e12},
        "NVIDIA H200 datasheet, H200 NVL column (1,671 TFLOPS BF16 with sparsity), dense",
    ),
    (
        "H200",
        {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 66.9e12},
        "NVIDIA H200 datasheet (SXM), same tensor cores as H100 SXM; dense, without sparsity",
    ),
    (
        "H100 NVL",
        {"bfloat16": 835.5e12, "float16": 835.5e12, "tf32": 417.5e12, "float32": 60e12},
        "NVIDIA H100 datasheet, H100 NVL column per GPU (1,671 TFLOPS BF16 with sparsity), dense",
    ),
    (
        "H100 PCIe",
        {"bfloat16": 756e12, "float16": 756e12, "tf32": 378e12, "float32": 51.2e12},
        "NVIDIA H100 datasheet, PCIe column, dense",
    ),
    (
        "H100",
        {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 66.9e12},
        "NVIDIA H100 datasheet, SXM column, dense",
    ),
    (
        "A100",
        {"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12},
        "NVIDIA A100 datasheet, dense",
    ),
    (
        "L40S",
        {"bfloat16": 362e12, "float16": 362e12, "tf32": 183e12, "float32": 91.6e12},
        "NVIDIA L40S datasheet, dense",
    ),
    ("L4", {"bfloat16": 121e12, "float16": 121e12, "tf32": 60e12, "float32": 30.3e12}, "NVIDIA L4 datasheet, dense"),
    (
        "A10",
        {"bfloat16": 125e12, "float16": 125e12, "tf32": 62.5e12, "float32": 31.2e12},
        "NVIDIA A10 datasheet, dense",
    ),
    (
        "RTX 4090",
        {"bfloat16": 165.2e12, "float16": 165.2e12, "tf32": 82.6e12, "float32": 82.6e12},
        "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090, FP32-accumulate dense",
    ),
    ("V100", {"float16": 125e12, "float32": 15.7e12}, "NVIDIA V100 datasheet (SXM2), dense"),
    ("T4", {"float16": 65e12, "float32": 8.1e12}, "NVIDIA T4 datasheet (65 TFLOPS mixed FP16/FP32), dense"),
]


@dataclass(frozen=True)
class Card:
    """A card the project knows, for planning on one this machine does not have (`autotune plan
    --gpu`): its name as NVML gives it (what the peaks above are found by), the memory
    nvidia-smi reports as its total, and its compute capability."""

    name: str
    memory_mib: int
    compute_capability: str

    def device(self) -> DeviceInfo:
        return DeviceInfo(
            kind="cuda",
            name=self.name,
            total_memory_bytes=self.memory_mib * 2**20,
            compute_capability=self.compute_capability,
        )


# The SXM cards where a card comes as SXM and PCIe. The A10G (AWS's A10) has no datasheet of
# its own: the A10's peak above is the one it gets.
CARDS: dict[str, Card] = {
    "a100-40gb": Card("NVIDIA A100-SXM4-40GB", 40960, "8.0"),
    "a100-80gb": Card("NVIDIA A100-SXM4-80GB", 81920, "8.0"),
    "h100-80gb": Card("NVIDIA H100 80GB HBM3", 81559, "9.0"),
    "h200": Card("NVIDIA H200", 143771, "9.0"),
    "rtx-4090": Card("NVIDIA GeForce RTX 4090", 24564, "8.9"),
    "l4": Card("NVIDIA L4", 23034, "8.9"),
    "a10g": Card("NVIDIA A10G", 23028, "8.6"),
    "t4": Card("Tesla T4", 15360, "7.5"),
}

# NVML names a MIG instance "<card> MIG <profile>" ("NVIDIA H100 80GB HBM3 MIG 1g.10gb"). A
# slice has a fraction of the card's SMs, and not a fixed one (1g of an H100 SXM is 16 of
# 132 SMs, not 1/7): the card's peak would overstate MFU several times, so none is given.
MIG_MARK = " MIG "


@dataclass(frozen=True)
class PeakFlops:
    """What MFU divides by on a device: the dense peak per dtype (None: unknown) and why."""

    by_dtype: dict[str, float] | None
    source: str

    def get(self, amp_dtype: str) -> float | None:
        return self.by_dtype.get(amp_dtype) if self.by_dtype else None


def peak_flops_entry(device_name: str) -> PeakFlops:
    """The table's entry for this device name; when there is none, `by_dtype` is None and
    `source` says why."""
    if MIG_MARK in f" {device_name} ":
        return PeakFlops(None, "a MIG instance: the whole card's peak does not apply, so MFU is not reported")
    for fragment, by_dtype, source in PEAK_FLOPS:
        if fragment in device_name:
            return PeakFlops(dict(by_dtype), source)
    return PeakFlops(None, f"{device_name!r} is not in the peak-FLOPs table (autotune/device/flops.py)")


# What a large dense matmul was measured to reach on a real card, keyed by the table's fragment
# above (so an "H200 NVL" is not taken for the SXM card): the ceiling a training step can
# approach in practice, below the datasheet's (clocks under load, cuBLAS's best tile). MFU
# against it says how far a step is from what the card really does; against the datasheet, from
# the silicon. Only figures measured on a real card are listed; `autotune doctor` measures one
# on any machine (its `matmul` check).
MEASURED_PEAK_FLOPS: dict[str, tuple[dict[str, float], str]] = {
    "H200": (
        {"bfloat16": 790e12},
        "a large bf16 matmul on a real H200 (SXM): about 790 TFLOP/s of the datasheet's 989 (the project's mission)",
    ),
}


def measured_peak_flops(device_name: str, amp_dtype: str) -> tuple[float, str] | None:
    """(FLOP/s, source) a large matmul was measured to reach on this card in this dtype, or
    None where no such measurement is known (MIG instances never: a slice is not the card)."""
    if MIG_MARK in f" {device_name} ":
        return None
    fragment = next((f for f, _, _ in PEAK_FLOPS if f in device_name), None)
    by_dtype, source = MEASURED_PEAK_FLOPS.get(fragment or "", ({}, ""))
    return (by_dtype[amp_dtype], source) if amp_dtype in by_dtype else None


def peak_flops(device_name: str, amp_dtype: str) -> float | None:
    """Peak FLOP/s of this device in the dtype the matmuls run in; None when unknown (CPUs,
    MIG instances, cards missing from the table)."""
    return peak_flops_entry(device_name).get(amp_dtype)
