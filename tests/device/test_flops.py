"""autotune.device.flops: the peak FLOP/s table, by device name and compute dtype, with its sources."""

from __future__ import annotations

import pytest

from autotune.device import PEAK_FLOPS, peak_flops
from autotune.device.flops import CARDS, MEASURED_PEAK_FLOPS, measured_peak_flops


@pytest.mark.parametrize(
    "name, dtype, flops",
    [
        ("NVIDIA H200", "bfloat16", 989e12),
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.5e12),
        ("NVIDIA H100 PCIe", "bfloat16", 756e12),  # PCIe is listed before the SXM fragment "H100"
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312e12),
        ("NVIDIA A100-SXM4-80GB", "float32", 19.5e12),
        ("NVIDIA A100-PCIE-40GB", "float16", 312e12),
        ("Tesla V100-SXM2-16GB", "bfloat16", None),  # no bfloat16 on Volta
        ("AMD EPYC 7B13", "bfloat16", None),
        ("Some Future GPU", "float16", None),
    ],
)
def test_peak_flops_lookup(name, dtype, flops):
    assert peak_flops(name, dtype) == flops


def test_peak_flops_table_cites_sources():
    assert all(source for _, _, source in PEAK_FLOPS)


def test_a_measured_peak_only_where_a_real_card_of_that_kind_was_measured():
    """790 TFLOP/s: a large bf16 matmul on a real H200 (SXM). Not an H200 NVL (lower clocks and
    power), not a MIG slice, not a dtype nobody measured; every figure is below its datasheet's."""
    assert measured_peak_flops("NVIDIA H200", "bfloat16")[0] == 790e12
    assert measured_peak_flops("NVIDIA H200 NVL", "bfloat16") is None
    assert measured_peak_flops("NVIDIA H200 MIG 1g.18gb", "bfloat16") is None
    assert measured_peak_flops("NVIDIA H200", "float16") is None
    assert measured_peak_flops("NVIDIA A100-SXM4-80GB", "bfloat16") is None
    for fragment, (by_dtype, source) in MEASURED_PEAK_FLOPS.items():
        assert source and all(v < peak_flops(f"NVIDIA {fragment}", d) for d, v in by_dtype.items())


def test_every_card_the_project_knows_is_a_device_with_its_memory_capability_and_peak():
    """The cards `autotune plan --gpu` plans for: each a CUDA device with its memory and compute
    capability, whose peak the table above finds by the name NVML gives it."""
    assert {"a100-40gb", "a100-80gb", "h100-80gb", "h200", "rtx-4090", "l4", "a10g", "t4"} <= set(CARDS)
    for card in CARDS.values():
        device = card.device()
        assert device.kind == "cuda" and device.total_memory_bytes >= 15 * 2**30
        half = "bfloat16" if device.capability_tuple >= (8, 0) else "float16"
        assert peak_flops(device.name, half), card
    assert CARDS["h200"].device().total_memory_bytes > CARDS["h100-80gb"].device().total_memory_bytes
