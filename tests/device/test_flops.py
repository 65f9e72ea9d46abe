"""autotune.device.flops: the peak FLOP/s table, by device name and compute dtype, with its sources."""

from __future__ import annotations

import pytest

from autotune.device import PEAK_FLOPS, peak_flops


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
