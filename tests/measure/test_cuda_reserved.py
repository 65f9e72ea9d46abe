"""Reserved versus allocated on CUDA (issue 16, item 2), through the strict fakes: a run records
torch's reserved peak (the caching allocator's segments) beside its allocated peak (live
tensors), and the worst case it is judged on is NVML's, which holds the reserved segments."""

from __future__ import annotations

import pytest

from autotune.config import RunSpec, TrainConfig
from autotune.measure.loop import measure
from tests.cuda_fakes import FakeCuda, FakeGpu, FakeMachine, GiB, fake_gpu_machine

SPEC = {"model": "gpt2-tiny", "steps": 2, "warmup": 0, "min_time_s": 0}
pytestmark = pytest.mark.cuda_fakes  # skipped where a real GPU is visible (conftest)


def fragmented(reserved: int, live: int):
    """At the first synchronize: segments of `reserved` bytes for a peak of `live` live bytes."""

    def hook(cuda: FakeCuda, index: int) -> None:
        if not cuda.reserved.get(index):
            cuda.allocate(index, reserved)
            cuda.allocated[index] = cuda.peak_allocated[index] = live

    return hook


def test_reserved_and_allocated_peaks_are_recorded_apart(monkeypatch):
    machine = FakeMachine([FakeGpu()])
    with fake_gpu_machine(monkeypatch, machine) as cuda:
        cuda.on_sync.append(fragmented(2 * GiB, int(1.5 * GiB)))
        m = measure(RunSpec(device="cuda:0", **SPEC), TrainConfig(token_budget=256, batching="fixed"))
    assert m.outcome == "ok", m.reason
    assert (m.allocator_reserved_peak_bytes, m.allocator_peak_bytes) == (2 * GiB, int(1.5 * GiB))
    # The cache keeps its segments: the window holds them too, and NVML counts them with the context.
    assert m.peak_memory_bytes == m.window_peak_memory_bytes == machine.context_bytes + 2 * GiB
