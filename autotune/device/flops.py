"""The peak-FLOPs table that MFU divides by, in one place, each entry with its source."""

from __future__ import annotations

# Dense (no sparsity) peak FLOP/s by device name fragment and compute dtype. Each entry cites
# its source. Order matters: the first fragment found in the device name wins.
PEAK_FLOPS: list[tuple[str, dict[str, float], str]] = [
    (
        "H200",
        {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 66.9e12},
        "NVIDIA H200 datasheet (SXM), same tensor cores as H100 SXM; dense, without sparsity",
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
]


def peak_flops(device_name: str, amp_dtype: str) -> float | None:
    """Peak FLOP/s of this device in the dtype the matmuls run in; None when unknown (CPUs)."""
    for fragment, by_dtype, _source in PEAK_FLOPS:
        if fragment in device_name:
            return by_dtype.get(amp_dtype)
    return None
