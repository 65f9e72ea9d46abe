"""The CUDA paths of the measuring loop, bench, profile, verify and --devices, run on the CPU
with strict fakes of torch.cuda and NVML (tests/cuda_fakes.py): the code every GPU run goes
through, executed before any GPU is lent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from autotune.cli import main
from autotune.config import RunSpec, TrainConfig
from autotune.device import resolve_device
from autotune.measure.loop import measure
from tests.cuda_fakes import H200_TOTAL, FakeCuda, FakeGpu, FakeMachine, GiB, MiB, child_env, fake_gpu_machine

SPEC = {"model": "gpt2-tiny", "steps": 2, "warmup": 0, "min_time_s": 0}
CFG = TrainConfig(token_budget=256, batching="fixed")  # one batch shape: one warm-up step for it
TINY_SPACE = Path(__file__).resolve().parents[1] / "spaces" / "tiny.yaml"
SECOND = "GPU-0a1b2c3d-0000-4000-8000-000000000002"
pytestmark = pytest.mark.cuda_fakes  # skipped where a real GPU is visible (conftest)


@pytest.fixture
def gpus(monkeypatch):
    """Two H200s on the host's PID namespace."""
    machine = FakeMachine([FakeGpu(), FakeGpu(uuid=SECOND)])
    with fake_gpu_machine(monkeypatch, machine) as cuda:
        yield cuda


def grow(reserved: int, extra: int):
    """At the first synchronize: the allocator takes `reserved`, libraries `extra` beside it."""

    def hook(cuda: FakeCuda, index: int) -> None:
        if not cuda.reserved.get(index):
            cuda.allocate(index, reserved)
            cuda.extra[index] = extra

    return hook


# --- the device -----------------------------------------------------------------------------------


def test_auto_is_an_indexed_cuda_device_and_each_gpu_is_timed_on_its_own_stream(gpus):
    device = resolve_device("auto")
    assert device == "cuda:0"  # torch.cuda.set_device refuses torch.device("cuda")
    m = measure(RunSpec(device=device, **SPEC), CFG)
    assert m.outcome == "ok", m.reason
    assert m.device["name"] == "NVIDIA H200" and m.step_time_median_s > 0 and m.steps in (2, 4)
    assert set(gpus.work_devices) == set(gpus.event_devices) == {0}
    # The second GPU: set current, worked on, and timed by events on its own stream only.
    gpus.work_devices.clear()
    gpus.event_devices.clear()
    m = measure(RunSpec(device="cuda:1", **SPEC), CFG)
    assert m.outcome == "ok", m.reason
    assert m.device["uuid"] == SECOND and gpus.current == 1
    assert set(gpus.work_devices) == set(gpus.event_devices) == {1}


def test_mfu_against_the_datasheet_and_against_a_real_h200s_measured_matmul_peak(gpus):
    """The datasheet's 989 TFLOP/s bf16 is not what an H200 reaches: a large matmul measured
    790. Both figures, each labelled; the second only where a card of that kind was measured."""
    from autotune.present.summaries import format_measurement

    m = measure(RunSpec(device="cuda:0", **SPEC), CFG.replace(amp_dtype="bfloat16"))
    assert m.outcome == "ok", m.reason
    assert m.mfu > 0 and m.mfu_measured_peak == pytest.approx(m.mfu * 989 / 790)
    assert "of the datasheet's peak" in format_measurement(m) and "of a large matmul's measured peak" in (
        format_measurement(m)
    )
    fp32 = measure(RunSpec(device="cuda:0", **SPEC), CFG)  # float32: nobody measured an H200's
    assert fp32.mfu > 0 and fp32.mfu_measured_peak is None


def test_a_spec_without_an_index_is_measured_on_device_0(gpus):
    m = measure(RunSpec(device="cuda", **SPEC), CFG)
    assert m.outcome == "ok", m.reason
    assert gpus.contexts == {0} and m.device["index"] == 0


def test_a_cuda_index_beyond_the_visible_gpus_is_a_usage_error(gpus):
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match=r"device cuda:2 is not available here \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:2")
    assert resolve_device("cuda") == "cuda:0"


def test_bench_in_its_own_process_measures_the_gpu_it_describes(monkeypatch):
    """CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML by PCI bus.
    Trials get the variable from their runner; bench measures in the command's process."""
    a10 = FakeGpu(
        name="NVIDIA A10",
        uuid="GPU-a10a10a1-0000-4000-8000-000000000000",
        capability=(8, 6),
        speed=1,
        mig_capable=False,
    )
    machine = FakeMachine([a10, FakeGpu(speed=10)])
    with fake_gpu_machine(monkeypatch, machine) as cuda:
        args = ["bench", "--model", "gpt2-tiny", "--device", "cuda:0", "--steps", "2", "--warmup", "0", "--json"]
        args += ["--min-time", "0"]
        args += ["--set", "token_budget=256", "--set", "batching=fixed"]  # CFG: one batch shape to warm up
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)
    assert m["device"]["name"] == "NVIDIA A10"
    assert {cuda.units[i].uuid for i in cuda.work_devices} == {a10.uuid}  # the GPU described is the GPU measured
    assert cuda.order_at_init == "PCI_BUS_ID"


# --- memory ----------------------------------------------------------------------------------------


def test_peak_memory_counts_the_context_and_libraries_in_a_container_too(monkeypatch):
    """Inside a container NVML lists host PIDs, never os.getpid(): the device's used memory
    minus the baseline read before CUDA started is then this process's, other processes'
    memory excluded. On the host, NVML's per-process figure."""
    for container, source in ((True, "nvml-device"), (False, "nvml-process")):
        machine = FakeMachine([FakeGpu(others_used=3 * GiB)], container=container)
        with fake_gpu_machine(monkeypatch, machine) as cuda:
            cuda.on_sync.append(grow(1 * GiB, 200 * MiB))
            m = measure(RunSpec(device="cuda:0", **SPEC), CFG)
        assert m.outcome == "ok", m.reason
        assert (m.peak_memory_source, m.peak_memory_bytes) == (source, machine.context_bytes + 1 * GiB + 200 * MiB)
        assert m.allocator_peak_bytes == 1 * GiB


def test_the_allocator_cap_leaves_room_for_the_memory_it_does_not_manage(gpus):
    limit = 4 * GiB
    gpus.on_sync.append(grow(1 * GiB, 400 * MiB))
    m = measure(RunSpec(device="cuda:0", memory_limit_bytes=limit, **SPEC), CFG)
    assert m.outcome == "ok", m.reason
    context = gpus.machine.context_bytes
    first, last = gpus.fraction_calls[0], gpus.fraction_calls[-1]
    assert first[1] == last[1] == 0
    assert first[0] * H200_TOTAL == pytest.approx(limit - context)  # at the start: the context
    assert last[0] * H200_TOTAL == pytest.approx(limit - context - 400 * MiB)  # after warm-up: libraries too
    assert m.peak_memory_bytes <= limit


def test_a_configuration_over_the_cap_fails_fast_as_oom(gpus):
    # 3.5 GiB of tensors fit a 4 GiB limit alone, not beside the CUDA context.
    gpus.on_sync.append(grow(int(3.5 * GiB), 0))
    m = measure(RunSpec(device="cuda:0", memory_limit_bytes=4 * GiB, **SPEC), CFG)
    assert m.outcome == "oom" and m.reason.startswith("out of memory: CUDA out of memory"), m.reason


def test_a_limit_below_the_cuda_context_is_oom_with_its_reason(gpus):
    m = measure(RunSpec(device="cuda:0", memory_limit_bytes=512 * MiB, **SPEC), CFG)
    assert m.outcome == "oom"
    assert m.reason == (
        "out of memory: the memory limit 512.00 MiB leaves nothing for tensors once the CUDA context and "
        "libraries take 600.00 MiB"
    )


def test_without_nvml_the_gpu_is_described_by_torch_and_memory_read_from_the_allocator(monkeypatch, caplog):
    machine = FakeMachine(nvml=False)
    with caplog.at_level("WARNING", logger="autotune.device.nvml"), fake_gpu_machine(monkeypatch, machine) as cuda:
        cuda.on_sync.append(grow(1 * GiB, 200 * MiB))
        device = resolve_device("auto")
        m = measure(RunSpec(device=device, **SPEC), CFG)
    assert device == "cuda:0" and m.outcome == "ok", m.reason
    assert m.device["name"] == "NVIDIA H200" and m.device["uuid"] == FakeGpu().uuid and m.device["driver"] is None
    # Said once: the allocator's figure misses the context and the libraries.
    assert (m.peak_memory_source, m.peak_memory_bytes) == ("allocator-reserved", 1 * GiB)
    assert [r.getMessage() for r in caplog.records if "NVML unavailable" in r.getMessage()] == [
        "NVML unavailable (NVML Shared Library Not Found): memory figures come from torch's allocator"
    ]
    assert m.gpu_utilization is None


# --- profile, verify, --devices ------------------------------------------------------------------


@pytest.mark.slow
def test_profile_sets_up_cuda_with_the_device_index(gpus, tmp_path):
    from autotune.measure.profile import profile_config

    report = profile_config(CFG, model_name="gpt2-tiny", device="cuda", steps=2, warmup=0, out_dir=tmp_path)
    assert report.device == "cuda:0" and report.device_name == "NVIDIA H200"
    # Device time where the build traces the GPU; this CPU build's kineto does not (asked
    # anyway, it traced nothing and took a minute).
    traces_gpu = torch.profiler.ProfilerActivity.CUDA in torch.profiler.supported_activities()
    assert report.time_basis == ("self device time" if traces_gpu else "self CPU time") and report.wall_s > 0
    assert gpus.current == 0 and set(gpus.work_devices) == {0}


@pytest.mark.process
def test_verify_re_measures_a_recipe_on_a_gpu_in_a_fresh_process(monkeypatch, tmp_path):
    from autotune.recipe.recipe import Recipe
    from autotune.recipe.verify import verify_recipe

    machine = FakeMachine(container=True)
    for key, value in child_env(machine, tmp_path).items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    recipe = Recipe(
        config=CFG,
        model={"name": "gpt2-tiny", "seq_len": 128},
        measured={"tokens_per_sec": 1.0, "peak_memory_bytes": 2 * GiB, "memory_limit_bytes": 8 * GiB},
        hardware={"kind": "cuda", "name": "NVIDIA H200"},
    )
    with fake_gpu_machine(monkeypatch, machine):
        result = verify_recipe(recipe, device=resolve_device("auto"), tolerance=0.5, steps=2, warmup=0, min_time_s=0)
    assert result["outcome"] == "ok" and result["passed"], result["reason"]
    assert result["measured"]["peak_memory_source"] == "nvml-device"
    assert result["measured"]["peak_memory_bytes"] == machine.context_bytes  # the fake allocator holds nothing


@pytest.mark.process
def test_devices_workers_measure_each_on_its_own_gpu(monkeypatch, tmp_path):
    """--devices 0,1 with two fake GPUs in a container: each worker and its trials run in
    their own processes (fakes installed there too), pinned by UUID, on cuda:0 of their view."""
    import autotune.search.fleet
    import autotune.search.run
    from autotune.study.storage import open_storage

    machine = FakeMachine([FakeGpu(), FakeGpu(uuid=SECOND)], container=True)
    for key, value in child_env(machine, tmp_path).items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    url = f"journal:{tmp_path / 'fleet.journal'}"
    settings = autotune.search.run.SearchSettings(
        model="gpt2-tiny",
        n_trials=2,
        space=str(TINY_SPACE),
        study="fleet",
        storage=url,
        steps=2,
        warmup=0,
        min_time_s=0,
        trial_timeout_s=240,
        memory_limit_bytes=8 * GiB,
        confirm=False,  # each worker would re-measure the leaders: trials on the same GPUs, not the subject
    )
    with fake_gpu_machine(monkeypatch, machine):
        result = autotune.search.fleet.run_workers(settings, "0,1")
    assert result.worker_failures == []
    import optuna

    study = optuna.load_study(study_name="fleet", storage=open_storage(url, grace_period_s=None))
    measured = [t.user_attrs["measurement"] for t in study.trials if t.user_attrs.get("measurement")]
    assert len(measured) == 2
    # One trial per worker (split_trials: 2 over 2), each on its own GPU: both GPUs measured,
    # neither twice (a subset check passes with both workers on the first GPU).
    assert machine.gpus[0].uuid != SECOND
    assert sorted(m["device"]["uuid"] for m in measured) == sorted([machine.gpus[0].uuid, SECOND])
    assert all(m["outcome"] == "ok" and m["peak_memory_source"] == "nvml-device" for m in measured), measured
