"""autotune.device.flops: the peak FLOP/s table, by device name and compute dtype, with its sources."""

from __future__ import annotations

import pytest

from autotune.device import PEAK_FLOPS, peak_flops
from autotune.device.flops import MEASURED_PEAK_FLOPS, measured_peak_flops


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
