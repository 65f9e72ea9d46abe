"""A busy host is said (issue D, #2: on a host loaded beyond its cores a CPU trial ran 9.3x
slower with one thread per core, and nothing said the host was busy): `search`, `bench` and
`doctor` warn when the load over the last minute exceeds the usable CPUs."""

from __future__ import annotations

import json
import logging
import os

import pytest

import autotune.device.info
from autotune.device.info import busy_host
from tests.attack_helpers import FAST, fake_trials
from tests.helpers import invoke


@pytest.fixture
def busy(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (9.3, 4.0, 2.0))
    monkeypatch.setattr(autotune.device.info, "usable_cpus", lambda: 2)


def test_a_load_beyond_the_cores_is_said_and_one_within_them_is_not(busy, monkeypatch):
    assert "a load of 9.3 over the last minute on 2 usable CPUs" in busy_host()
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 1.0, 1.0))
    assert busy_host() is None


@pytest.mark.slow
def test_search_says_the_host_is_busy(busy, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    with caplog.at_level(logging.WARNING):
        result = invoke("search", *FAST, "--n-trials", "1", "--no-confirm", "--no-references")
    assert result.exit_code == 0, result.output
    assert "this host is busy: a load of 9.3" in caplog.text


@pytest.mark.slow
def test_bench_says_the_host_was_busy_beside_its_figures(busy):
    # 1024 tokens a step, no minimum time (the defaults, 8192 and 2 s, are 8x the work and more)
    args = ("--steps", "2", "--warmup", "0", "--min-time", "0", "--set", "token_budget=1024", "--json")
    result = invoke("bench", "--model", "gpt2-tiny", "--device", "cpu", *args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outcome"] == "ok"
    assert "Warning: this host is busy: a load of 9.3" in result.stderr


def test_doctor_warns_of_a_busy_host_and_still_passes(busy, monkeypatch):
    from autotune.measure import doctor

    monkeypatch.setattr(doctor, "check_compile", lambda device, info: doctor.Check(True, "skipped", 0.0))
    monkeypatch.setattr(doctor, "SDPA_SHAPE_CPU", (1, 2, 16, 8))
    monkeypatch.setattr(doctor, "MATMUL_SIZE", {"cuda": 64, "cpu": 64})
    result = invoke("doctor")
    assert result.exit_code == 0, result.output
    assert "warnings:\n  - this host is busy" in result.stdout and "ok: this machine can run a study" in result.stdout
