"""autotune.search.references: the checklist turns on what the device runs natively; on a CPU
without bf16 instructions it trains in float32 (emulated bf16 is slower than the baseline)."""

from __future__ import annotations

import pytest

from autotune.knobs.support import DeviceCapabilities, cpu_has_bf16
from autotune.search.references import checklist_config

EPYC_AVX2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    "cpuinfo, expected",
    [(EPYC_AVX2, False), (SAPPHIRE_RAPIDS, True), (GRAVITON3, True), ("", None), (None, None)],
)
def test_cpu_bf16_is_read_from_the_cpus_flags(cpuinfo, expected):
    assert cpu_has_bf16(cpuinfo) is expected


def test_the_checklist_trains_in_float32_on_a_cpu_without_bf16():
    cfg, notes = checklist_config(128, DeviceCapabilities("cpu", cpu_bf16=False))
    assert cfg.amp_dtype == "float32" and cfg.compile_mode == "default"
    assert "amp_dtype changed (this CPU has no bf16 instructions; emulated bf16 is slower than float32)" in notes


@pytest.mark.parametrize(
    "caps, amp",
    [
        (DeviceCapabilities("cpu", cpu_bf16=True), "bfloat16"),
        (DeviceCapabilities("cuda", (9, 0)), "bfloat16"),
        (DeviceCapabilities("cuda", (7, 0)), "float16"),  # Volta: no bf16 at all
    ],
)
def test_the_checklist_keeps_bf16_where_the_device_has_it(caps, amp):
    cfg, notes = checklist_config(128, caps)
    assert cfg.amp_dtype == amp and not any(n.startswith("amp_dtype changed (this CPU") for n in notes)


def test_this_machine_is_read_the_same_way(monkeypatch):
    import autotune.knobs.support as support

    monkeypatch.setattr(support, "_read_cpuinfo", lambda: EPYC_AVX2)
    assert DeviceCapabilities.detect("cpu", None).cpu_bf16 is False
    assert DeviceCapabilities.detect("cuda", (9, 0)).cpu_bf16 is True  # a CPU matter only
    monkeypatch.setattr(support, "_read_cpuinfo", lambda: None)  # unknown: the seed's bf16
    assert DeviceCapabilities.detect("cpu", None).cpu_bf16 is True
