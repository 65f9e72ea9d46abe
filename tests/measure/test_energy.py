"""Energy per token: NVML's counter around the timed window (strict NVML fakes), null with a
reason on MIG slices and GPUs without the counter, and RAPL from a fake sysfs tree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.config import RunSpec, TrainConfig
from autotune.measure.energy import (
    NVML_DEVICE,
    NVML_MIN_WINDOW_S,
    RAPL_PACKAGE,
    NvmlEnergyMeter,
    energy_meter,
    rapl_meter,
    wrapped_delta,
)
from autotune.measure.loop import measure
from tests.cuda_fakes import FakeGpu, FakeMachine, FakeMig, FakeNvmlLib, fake_gpu_machine

SPEC = {"model": "gpt2-tiny", "steps": 2, "warmup": 0, "min_time_s": 0}
CFG = TrainConfig(token_budget=256, batching="fixed")
MIG = "MIG-aaaaaaaa-1111-5555-9999-000000000001"


@pytest.mark.cuda_fakes
def test_the_gpu_counter_is_read_after_the_synchronizes_that_bracket_the_window(monkeypatch):
    """Joules per token = the counter's mJ over the window / 1000 / effective tokens: at the
    fake GPU's 700 W, joules/token x tokens/s is 700 W (a mJ-for-J mistake reads 700,000). Each
    read of the window follows a device synchronize: the energy of finished work only."""
    log: list[str] = []
    read = FakeNvmlLib._nvmlDeviceGetTotalEnergyConsumption

    def logged_read(self, handle, out):
        log.append("energy")
        return read(self, handle, out)

    monkeypatch.setattr(FakeNvmlLib, "_nvmlDeviceGetTotalEnergyConsumption", logged_read)
    monkeypatch.setattr(NvmlEnergyMeter, "min_window_s", 0.0)  # the fake counter resolves any window
    with fake_gpu_machine(monkeypatch, FakeMachine([FakeGpu(power_w=700.0)])) as cuda:
        cuda.on_sync.append(lambda _cuda, _index: log.append("sync"))
        m = measure(RunSpec(device="cuda:0", **SPEC), CFG)
    assert m.outcome == "ok", m.reason
    assert m.energy_source == NVML_DEVICE and m.energy_note is None
    watts = m.joules_per_token * m.tokens_per_sec
    assert watts == pytest.approx(700.0, rel=0.05)
    assert m.energy_joules > 0 and m.tokens_per_joule == pytest.approx(1 / m.joules_per_token)
    window_reads = [i for i, what in enumerate(log) if what == "energy"][-2:]  # before and after the kept window
    assert [log[i - 1] for i in window_reads] == ["sync", "sync"], log
    assert "sync" in log[window_reads[0] + 1 : window_reads[1]]  # the window closes with its own synchronize


@pytest.mark.cuda_fakes
@pytest.mark.parametrize(
    ("machine", "visible", "why"),
    [
        (FakeMachine([FakeGpu(migs=[FakeMig(MIG)])]), MIG, "MIG slice"),
        (FakeMachine([FakeGpu(energy_counter=False)]), None, "not supported"),
    ],
    ids=["mig", "no-counter"],
)
def test_no_energy_figure_on_a_mig_slice_or_without_the_counter_and_the_reason_says_why(
    monkeypatch, machine, visible, why
):
    with fake_gpu_machine(monkeypatch, machine, visible=visible):
        meter = energy_meter("cuda", MIG if visible else machine.gpus[0].uuid)
        m = measure(RunSpec(device="cuda:0", **SPEC), CFG)
    assert not meter.available and why in meter.note
    assert m.outcome == "ok", m.reason
    assert (m.energy_joules, m.joules_per_token, m.energy_source) == (None, None, None)
    assert why in m.energy_note


@pytest.mark.cuda_fakes
def test_a_window_shorter_than_the_counter_resolves_has_no_energy_figure_and_says_so(monkeypatch):
    """NVML's counter is updated every 10-100 ms: read at both ends of a window of a fraction of
    a second (2 steps here; a default window lasts 2 s), its error is tens of percent. No figure
    from a window under 5 s, and the note says how to get one."""
    with fake_gpu_machine(monkeypatch, FakeMachine([FakeGpu(power_w=700.0)])):
        m = measure(RunSpec(device="cuda:0", **SPEC), CFG)
    assert m.outcome == "ok", m.reason
    assert (m.energy_joules, m.joules_per_token, m.energy_source) == (None, None, None)
    assert m.energy_note.startswith("the timed window lasted ") and f"--min-time {NVML_MIN_WINDOW_S:g}" in m.energy_note


def test_tokens_per_joule_times_every_window_as_long_as_the_counter_needs():
    from autotune.device import describe
    from autotune.search.training import _min_time

    cpu = describe("cpu")  # RAPL, or no counter (a refusal before this, in a search)
    assert _min_time(2.0, "tokens_per_sec", cpu) == 2.0
    gpu = dataclasses.replace(cpu, kind="cuda", uuid="GPU-x")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("autotune.measure.energy.energy_meter", lambda kind, uuid: NvmlEnergyMeter(None, None))
        assert _min_time(2.0, "tokens_per_joule", gpu) == NVML_MIN_WINDOW_S
        assert _min_time(9.0, "tokens_per_joule", gpu) == 9.0


# --- RAPL ---------------------------------------------------------------------------------------


def package(root: Path, name: str, energy_uj: int, max_range_uj: int) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
    return zone


def test_rapl_sums_the_packages_and_survives_a_wrap(tmp_path):
    """Two packages; the second wraps past its max_energy_range_uj during the window. The core
    subzone (intel-rapl:0:0) is part of package 0 and is not added again."""
    zero = package(tmp_path, "intel-rapl:0", 1_000_000, 262_143_328_850)
    one = package(tmp_path, "intel-rapl:1", 262_143_000_000, 262_143_328_850)
    core = package(tmp_path, "intel-rapl:0:0", 5, 262_143_328_850)
    meter = rapl_meter(tmp_path)
    assert meter.available and meter.source == RAPL_PACKAGE
    start = meter.start()
    (zero / "energy_uj").write_text("3500000\n")  # +2.5 J
    (one / "energy_uj").write_text("171149\n")  # 328,850 to the top, 1 to 0, then 171,149: +0.5 J
    (core / "energy_uj").write_text("999999999\n")
    assert meter.joules_since(start) == pytest.approx(3.0)


def test_wrapped_delta():
    assert wrapped_delta(10, 25, 100) == 15
    assert wrapped_delta(90, 5, 100) == 16  # 90 -> 100 is 10, 100 -> 0 is 1, 0 -> 5 is 5


def test_no_rapl_gives_null_with_the_reason(tmp_path, monkeypatch):
    missing = energy_meter("cpu", powercap=tmp_path / "absent")
    assert not missing.available and "does not exist" in missing.note
    assert "no RAPL package zone" in rapl_meter(tmp_path).note  # the folder, without zones
    zone = package(tmp_path, "intel-rapl:0", 1, 100)
    real_read_text = Path.read_text

    def root_only(path: Path, *args, **kwargs):
        if path == zone / "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", root_only)
    meter = rapl_meter(tmp_path)
    assert not meter.available and "readable by root only" in meter.note
