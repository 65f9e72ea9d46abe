"""Devices as NVML sees them: MIG instances (used, or refused with the instances named), the
container-safe memory figure, and the peak-FLOPs table for the cards NVML names."""

from __future__ import annotations

import pytest

from autotune.config import RunSpec, TrainConfig
from autotune.device import describe, peak_flops, resolve_device, visible_gpu_uuids
from autotune.errors import UsageError
from autotune.measure.loop import measure
from tests.cuda_fakes import FakeGpu, FakeMachine, FakeMig, GiB, MiB, fake_gpu_machine

MIG_A = FakeMig("MIG-aaaaaaaa-1111-5555-9999-000000000001", gpu_instance=9, compute_instance=0)
MIG_B = FakeMig("MIG-bbbbbbbb-2222-6666-aaaa-000000000002", profile="3g.71gb", memory=71 * GiB, gpu_instance=2)
MIG_MACHINE = FakeMachine([FakeGpu(migs=[MIG_A, MIG_B])])


@pytest.mark.cuda_fakes
@pytest.mark.parametrize("visible", [MIG_B.uuid, MIG_B.uuid[:12], f"MIG-{FakeGpu().uuid}/2/0"])
def test_a_mig_instance_named_in_cuda_visible_devices_is_the_device(monkeypatch, visible):
    with fake_gpu_machine(monkeypatch, MIG_MACHINE, visible=visible):
        assert visible_gpu_uuids() == [MIG_B.uuid]
        assert resolve_device("auto") == "cuda:0"
        info = describe("cuda:0")
    assert info.name == "NVIDIA H200 MIG 3g.71gb" and info.uuid == MIG_B.uuid
    assert info.total_memory_bytes == 71 * GiB and info.compute_capability == "9.0"


GPU_B = "GPU-0b0b0b0b-0000-4000-8000-000000000002"
PLAIN = FakeMachine([FakeGpu(), FakeGpu(uuid=GPU_B, name="NVIDIA L4", mig_capable=False)])


@pytest.mark.cuda_fakes
@pytest.mark.parametrize(
    "visible, expected",
    [
        (None, [FakeGpu().uuid, GPU_B]),  # every GPU, in NVML's (PCI bus) order
        ("1,0", [GPU_B, FakeGpu().uuid]),  # indices, in the order given
        ("GPU-0b0b,0", [GPU_B, FakeGpu().uuid]),  # a UUID prefix, as CUDA accepts
        ("0b0b0b0b", [GPU_B]),  # a UUID without its GPU- prefix
        ("1,7,0", [GPU_B]),  # CUDA stops at the first invalid entry
        ("GPU-0,1", []),  # a prefix of both: ambiguous, invalid
        ("", []),
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(monkeypatch, visible, expected):
    with fake_gpu_machine(monkeypatch, PLAIN, visible=visible) as cuda:
        assert visible_gpu_uuids() == expected
        assert [u.uuid for u in cuda.enumerate()] == expected  # the fake's CUDA agrees


@pytest.mark.cuda_fakes
def test_a_measurement_on_a_mig_instance(monkeypatch):
    with fake_gpu_machine(monkeypatch, MIG_MACHINE, visible=MIG_A.uuid) as cuda:
        m = measure(
            RunSpec(model="gpt2-tiny", device=resolve_device("auto"), steps=2, warmup=0, min_time_s=0),
            TrainConfig(token_budget=256, batching="fixed"),
        )
    assert m.outcome == "ok", m.reason
    assert m.device["name"] == "NVIDIA H200 MIG 1g.18gb"
    assert m.peak_memory_source == "nvml-process" and m.peak_memory_bytes == cuda.machine.context_bytes
    assert m.gpu_utilization is None  # NVML has no utilization for a MIG instance
    assert m.mfu is None and m.mfu_at_context is None  # a slice's peak is not the card's


@pytest.mark.cuda_fakes
@pytest.mark.parametrize("visible", [None, "0"])
def test_a_mig_gpu_handed_to_cuda_whole_is_refused_with_its_instances(monkeypatch, visible):
    with fake_gpu_machine(monkeypatch, MIG_MACHINE, visible=visible):
        with pytest.raises(UsageError) as info:
            resolve_device("auto")
    assert str(info.value) == (
        f"GPU 0 ({FakeGpu().uuid}) is in MIG mode and cannot be used whole: set CUDA_VISIBLE_DEVICES to one of its "
        f"MIG instances ({MIG_A.uuid}, {MIG_B.uuid}); `nvidia-smi -L` lists them"
    )


@pytest.mark.cuda_fakes
def test_two_mig_instances_in_one_process_are_refused(monkeypatch):
    with fake_gpu_machine(monkeypatch, MIG_MACHINE, visible=f"{MIG_A.uuid},{MIG_B.uuid}"):
        with pytest.raises(UsageError, match="names 2 MIG instances, and a CUDA process can use only one"):
            visible_gpu_uuids()


def test_devices_refuses_mig_instances_with_what_to_do_instead():
    from autotune.search.fleet import parse_devices

    with pytest.raises(UsageError, match=r"MIG-aaaa is a MIG instance; --devices pins whole GPUs\. Run one search"):
        parse_devices("MIG-aaaa")


@pytest.mark.cuda_fakes
def test_the_memory_watch_in_a_container_subtracts_the_baseline(monkeypatch):
    """NVML's process list has host PIDs in a container: the device-level figure, less what
    was used before this process started CUDA, is this process's memory."""
    import torch

    from autotune.device.gpu_memory import GpuMemoryWatch

    machine = FakeMachine([FakeGpu(others_used=5 * GiB)], container=True)
    with fake_gpu_machine(monkeypatch, machine) as cuda:
        watch = GpuMemoryWatch(FakeGpu().uuid)
        watch.take_baseline(cuda_started=torch.cuda.is_initialized())
        assert watch.baseline == 5 * GiB
        torch.cuda.set_device(0)
        cuda.allocate(0, 2 * GiB)
        cuda.extra[0] = 300 * MiB
        assert watch.sample() == machine.context_bytes + 2 * GiB + 300 * MiB
        assert watch.peak() == (machine.context_bytes + 2 * GiB + 300 * MiB, "nvml-device")
        late = GpuMemoryWatch(FakeGpu().uuid)
        late.take_baseline(cuda_started=torch.cuda.is_initialized())  # CUDA already started here
        late.sample()
        assert late.baseline is None and late.peak() is None  # no honest figure: the caller falls back


@pytest.mark.parametrize(
    "name, dtype, peak",
    [
        ("NVIDIA H200", "bfloat16", 989e12),
        ("NVIDIA H200 NVL", "bfloat16", 835.5e12),
        ("NVIDIA H200 NVL", "tf32", 417.5e12),
        ("NVIDIA H100 NVL", "bfloat16", 835.5e12),
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12),
        ("NVIDIA H100 PCIe", "bfloat16", 756e12),
        ("NVIDIA H200 MIG 1g.18gb", "bfloat16", None),
        ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "bfloat16", None),
    ],
)
def test_the_peak_table_knows_nvl_cards_and_gives_mig_slices_none(name, dtype, peak):
    from autotune.device import peak_flops_entry

    assert peak_flops(name, dtype) == peak
    entry = peak_flops_entry(name)
    assert entry.source  # a datasheet, or why there is none
    if peak is None:
        assert "MIG" in entry.source
