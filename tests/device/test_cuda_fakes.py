"""The fakes of torch.cuda and NVML (tests/cuda_fakes.py) are strict: they refuse what the
real ones refuse, with torch's and pynvml's own checks where those exist. A CUDA path the
CPU suite passes is then one that does not misuse the API."""

from __future__ import annotations

import inspect
import os
import time

import pynvml
import pytest
import torch

from tests.cuda_fakes import BAD_FORK, HOST_PID_OFFSET, FakeGpu, FakeMachine, FakeMig, fake_gpu_machine

TWO = FakeMachine([FakeGpu(), FakeGpu(uuid="GPU-0a1b2c3d-0000-4000-8000-000000000002")])
pytestmark = pytest.mark.cuda_fakes  # skipped where a real GPU is visible (conftest)


def real_error(call) -> tuple[type, str]:
    """What torch's own functions raise, fakes or not, when the argument is wrong."""
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def test_index_less_devices_are_refused_by_torch_own_validator(monkeypatch):
    expected = real_error(lambda: torch.cuda.set_device(torch.device("cuda")))  # the CPU build checks first too
    assert expected[1].startswith("Expected a torch.device with a specified index or an integer")
    with fake_gpu_machine(monkeypatch, TWO) as cuda:
        assert real_error(lambda: torch.cuda.set_device(torch.device("cuda"))) == expected
        assert real_error(lambda: torch.cuda.set_per_process_memory_fraction(0.5, torch.device("cuda"))) == expected
        assert real_error(lambda: torch.cuda.set_per_process_memory_fraction(1, 0))[0] is TypeError  # not a float
        assert real_error(lambda: torch.cuda.set_per_process_memory_fraction(1.5, 0))[0] is ValueError
        assert real_error(lambda: torch.cuda.set_device(2))[1].startswith("CUDA error: invalid device ordinal")
        torch.cuda.set_device(1)
        assert torch.cuda.current_device() == 1 and cuda.contexts == {1}
        assert torch.cuda.current_stream().device_index == 1  # the current device's stream
        # torch's optional-index functions take "cuda" as the current device, as the real ones do.
        torch.cuda.reset_peak_memory_stats("cuda")
        assert torch.cuda.max_memory_allocated(torch.device("cuda")) == 0


def test_events_need_their_device_stream_timing_and_a_synchronize(monkeypatch):
    with fake_gpu_machine(monkeypatch, TWO) as cuda:
        torch.cuda.set_device(0)
        torch.ones(4, device="cuda:0")  # work on GPU 0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with pytest.raises(RuntimeError, match="Both events must be recorded"):
            start.elapsed_time(end)
        start.record()
        end.record(torch.cuda.current_stream(0))
        with pytest.raises(RuntimeError, match="Both events must be completed before calculating elapsed time"):
            start.elapsed_time(end)  # not synchronized yet
        torch.cuda.synchronize(0)
        assert start.elapsed_time(end) >= 0
        with pytest.raises(RuntimeError, match="does not match recording stream's device"):
            end.record(torch.cuda.current_stream(1))
        with pytest.raises(AssertionError, match="time the wrong device"):
            torch.cuda.Event(enable_timing=True).record(torch.cuda.current_stream(1))  # the work is on GPU 0
        untimed, other = torch.cuda.Event(), torch.cuda.Event(enable_timing=True)
        untimed.record()
        other.record()
        other.synchronize()  # stream order: the earlier event is complete too
        with pytest.raises(RuntimeError, match="invalid resource handle"):
            untimed.elapsed_time(other)
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.ones(1, device="cuda:7")
        assert cuda.work_devices == [0]


def parameters(function) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_fakes_keep_the_signatures_of_what_they_replace(monkeypatch):
    real = [
        parameters(f)
        for f in (
            torch.cuda.current_stream,
            torch.cuda.Event,
            torch.cuda.Event.record,
            torch.cuda.Event.elapsed_time,
            torch.cuda.Event.synchronize,
        )
    ]
    with fake_gpu_machine(monkeypatch):
        fake = [
            parameters(f)
            for f in (
                torch.cuda.current_stream,
                torch.cuda.Event,
                torch.cuda.Event.record,
                torch.cuda.Event.elapsed_time,
                torch.cuda.Event.synchronize,
            )
        ]
    assert [[name for name, *_ in f] for f in fake] == [[name for name, *_ in r] for r in real]
    assert [[default for *_, default in f] for f in fake] == [[default for *_, default in r] for r in real]


def test_nvml_goes_through_the_real_pynvml_wrappers_and_refuses_bad_handles(monkeypatch):
    mig_uuid = "MIG-11111111-2222-3333-4444-555555555555"
    machine = FakeMachine([FakeGpu(migs=[FakeMig(mig_uuid)])], container=True)
    with fake_gpu_machine(monkeypatch, machine, visible=mig_uuid):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H200"
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID("GPU-nope")
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetMemoryInfo(pynvml.c_nvmlDevice_t())  # a NULL handle
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
        assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA H200 MIG 1g.18gb"
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 1)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetUtilizationRates(mig)  # MIG instances have no utilization counter
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetPowerUsage(handle)  # not faked: the function is "missing", as in an old driver
        # In a container NVML lists the host's PIDs: ours (once it has a context) is not os.getpid().
        torch.cuda.set_device(0)
        pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)]
        assert pids and all(pid >= HOST_PID_OFFSET for pid in pids)
        first = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        time.sleep(0.01)
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) - first >= 7_000  # a counter, in mJ: 700 W x 10 ms
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetTotalEnergyConsumption(mig)  # a MIG instance has no counter of its own
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.c_nvmlDevice_t())  # a NULL handle


def in_a_fork(call) -> str:
    """What `call` gives, or raises, in a child forked from this process now."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once, nothing of pytest's teardown
        os.close(read)
        try:
            outcome = f"ok {call()}"
        except BaseException as exc:  # noqa: BLE001 - what it raised is the answer
            outcome = f"{type(exc).__name__}: {exc}"
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        outcome = f.read()
    os.waitpid(pid, 0)
    return outcome


def test_a_fork_after_cuda_started_cannot_use_cuda_as_torch_refuses_it(monkeypatch):
    """torch marks a child forked after CUDA started (an at-fork handler registered at its
    initialization): its first CUDA call raises torch's own words, and is_initialized() is False
    there. Forked before CUDA started, as trials are from the fork server, a child uses it."""
    import torch.cuda

    source = inspect.getsource(torch.cuda._lazy_init)  # the real one's message, in two literals
    assert '"Cannot re-initialize CUDA in forked subprocess. To use CUDA with "' in source
    assert "\"multiprocessing, you must use the 'spawn' start method\"" in source
    expected = BAD_FORK
    with fake_gpu_machine(monkeypatch) as cuda:
        assert in_a_fork(lambda: torch.ones(1, device="cuda:0").sum().item()) == "ok 1.0"
        assert not cuda.initialized  # the child's CUDA was its own
        torch.cuda.set_device(0)
        assert in_a_fork(lambda: torch.ones(1, device="cuda:0")).startswith(f"RuntimeError: {expected}")
        assert in_a_fork(lambda: torch.cuda.set_device(0)).startswith(f"RuntimeError: {expected}")
        assert in_a_fork(torch.cuda.is_initialized) == "ok False"
        assert in_a_fork(lambda: torch.manual_seed(1) and "seeded") == "ok seeded"  # leaves CUDA alone
        assert torch.cuda.is_initialized() and torch.ones(1, device="cuda:0").item() == 1.0  # the parent's is fine


def test_the_pin_memory_threads_device_index_call_is_taken_as_the_real_api_takes_it(monkeypatch):
    """The DataLoader's pin-memory thread calls torch.accelerator.set_device_index(device_id):
    the real API takes a visible index (and a negative one as a no-op); the fakes refused it."""
    two = FakeMachine([FakeGpu(), FakeGpu(uuid="GPU-0a1b2c3d-0000-4000-8000-000000000002", speed=9)])
    with fake_gpu_machine(monkeypatch, two) as cuda:
        torch.accelerator.set_device_index(1)
        assert cuda.current == 1
        torch.accelerator.set_device_index(-1)
        assert cuda.current == 1
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.accelerator.set_device_index(2)
