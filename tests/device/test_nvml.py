"""autotune.device.nvml: NVML missing is not an error, NVML failing on a GPU machine is said once,
and the memory limit holds without it (peak RSS on CPU)."""

from __future__ import annotations

import logging
import sys

import pytest

import autotune.device.nvml
from autotune.config import TrainConfig
from autotune.measure import outcomes
from tests.helpers import tiny_spec


@pytest.fixture
def fresh_nvml(monkeypatch):
    monkeypatch.setitem(autotune.device.nvml._nvml_state, "ok", None)
    monkeypatch.delitem(autotune.device.nvml._nvml_state, "module", raising=False)
    yield
    autotune.device.nvml._nvml_state.clear()
    autotune.device.nvml._nvml_state["ok"] = None


def test_nvml_missing_is_none_not_an_error(fresh_nvml, caplog):
    with caplog.at_level(logging.WARNING):
        assert autotune.device.nvml.load_nvml() is None  # no driver on this machine
        assert autotune.device.nvml.visible_gpu_uuids() is None
    assert "NVML" not in caplog.text  # a CPU machine has nothing to fall back from


def test_nvml_failing_on_a_gpu_machine_is_said_once(fresh_nvml, monkeypatch, caplog):
    import types

    broken = types.SimpleNamespace(
        nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("NVML Shared Library Not Found"))
    )
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    with caplog.at_level(logging.WARNING, logger="autotune.device.nvml"):
        for _ in range(3):
            assert autotune.device.nvml.load_nvml() is None
    warnings = [r for r in caplog.records if "NVML unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "torch's allocator" in warnings[0].getMessage()


@pytest.mark.slow
def test_memory_limit_is_still_enforced_on_cpu_without_nvml(fresh_nvml):
    from autotune.measure.loop import measure  # torch: imported by the one test that measures

    assert autotune.device.nvml.load_nvml() is None
    spec = tiny_spec(steps=2, memory_limit_bytes=64 * 1024**2)
    m = measure(spec, TrainConfig(token_budget=1024))
    assert m.outcome == outcomes.OVER_MEMORY_LIMIT and m.peak_memory_source == "rss"
    assert m.peak_memory_bytes > 64 * 1024**2
