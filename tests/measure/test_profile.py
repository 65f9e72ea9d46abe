"""autotune.measure.profile: operators are put in the right category, and time is attributed
to them by the CUDA rules (without a GPU: fake profiler events)."""

from __future__ import annotations

import pytest
from torch.autograd import DeviceType

from autotune.measure.profile import _shares, attribute, classify_op


@pytest.mark.parametrize(
    "name,category",
    [
        ("aten::addmm", "matmul"),
        ("autograd::engine::evaluate_function: MmBackward0", "matmul"),
        ("aten::_scaled_dot_product_flash_attention_backward", "attention"),
        ("aten::native_layer_norm_backward", "elementwise"),
        ("aten::gelu", "elementwise"),
        ("aten::copy_", "elementwise"),
        ("aten::_fused_adamw_", "optimizer"),
        ("aten::_foreach_mul_", "optimizer"),
        ("triton_poi_fused_add_native_layer_norm_0", "elementwise"),
        ("triton_tem_fused_mm_1", "matmul"),
        ("aten::embedding_dense_backward", "other"),
        ("aten::expand", "other"),
    ],
)
def test_classify_op(name, category):
    assert classify_op(name) == category


class FakeEvent:
    """What `attribute` reads of a profiler FunctionEvent (times in microseconds)."""

    def __init__(self, name, *, parent=None, cpu=0.0, device=0.0, cpu_total=None, device_type=DeviceType.CPU):
        self.name, self.cpu_parent, self.device_type, self.is_async = name, parent, device_type, False
        self.self_cpu_time_total, self.self_device_time_total = cpu, device
        self.cpu_time_total = cpu if cpu_total is None else cpu_total


def test_attribution_with_device_time():
    """The CUDA rules, without a GPU: kernel time is the launching op's self device time,
    data wait is the region's host time, regions and SDPA claim their children; a compiled
    graph's kernels go to what they fuse, and its own time is said as compiled, not split."""
    wait = FakeEvent("autotune:data_wait", cpu=900, cpu_total=1000)
    opt = FakeEvent("autotune:optimizer", cpu=50, device=0)
    sdpa = FakeEvent("aten::scaled_dot_product_attention", cpu=5, device=0)
    graph = FakeEvent("## Call CompiledFxGraph fxyz ##", cpu=30, device=60)
    events = [
        wait,
        FakeEvent("aten::copy_", parent=wait, cpu=100, device=7),  # inside the wait: host time only
        opt,
        FakeEvent("aten::_fused_adamw_", parent=opt, cpu=10, device=300),
        FakeEvent("aten::copy_", parent=opt, cpu=1, device=20),
        sdpa,
        FakeEvent("aten::_scaled_dot_product_flash_attention", parent=sdpa, cpu=5, device=400),
        FakeEvent("aten::mm", cpu=20, device=2000),
        FakeEvent("aten::native_layer_norm", cpu=10, device=100),
        FakeEvent("aten::copy_", cpu=3, device=80),
        FakeEvent("void gemm_kernel<...>", device=2000, device_type=DeviceType.CUDA),  # counted on aten::mm
        graph,
        FakeEvent("triton_per_fused_native_layer_norm_0", parent=graph, cpu=2, device=90),
        FakeEvent("aten::bmm", parent=graph, cpu=2, device=150),  # QK^T or PV of a compiled block
    ]
    seconds, ops = attribute(events, device_time=True)
    assert seconds == pytest.approx(
        {
            "data_wait": 1000e-6,
            "attention": 550e-6,
            "matmul": 2000e-6,
            "elementwise": 270e-6,
            "optimizer": 320e-6,
            "compiled": 60e-6,
            "other": 0.0,
        }
    )
    assert ops["aten::copy_", "optimizer"] == [pytest.approx(20e-6), 1]
    assert ops["aten::copy_", "elementwise"] == [pytest.approx(80e-6), 1]
    shares, filled = _shares(seconds, wall=0.005)
    assert ops["aten::bmm", "attention"] == [pytest.approx(150e-6), 1]
    assert filled["other"] == pytest.approx(0.005 - 4200e-6)  # idle device and overhead
    assert sum(shares.values()) == pytest.approx(1.0)
