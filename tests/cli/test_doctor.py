"""`autotune doctor`: a true account of this machine (a CPU here), and of GPU machines as the
fakes describe them: a container, a MIG GPU handed whole, a missing compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import autotune
import autotune.measure.doctor
from autotune.cli import main
from autotune.measure.doctor import Check
from tests.cuda_fakes import FakeGpu, FakeMachine, FakeMig, fake_gpu_machine


@pytest.fixture
def quick_compile(monkeypatch):
    """The compile check compiles for real (tens of seconds on this CPU): the `compile` test
    below runs it; the others take its answer as given."""
    monkeypatch.setattr(autotune.measure.doctor, "check_compile", lambda device, info: Check(True, "skipped", 0.0))


@pytest.fixture
def small_sdpa(monkeypatch):
    """SDPA runs on this CPU (behind the fake GPUs too): at GPT-2's context that is seconds per
    backend and dtype. The tests that take this are about MIG, containers, the compiler and the
    text, not SDPA (the first test runs it at the real shape), so a small shape serves."""
    monkeypatch.setattr(autotune.measure.doctor, "SDPA_SHAPE", (1, 2, 16, 8))
    monkeypatch.setattr(autotune.measure.doctor, "SDPA_SHAPE_CPU", (1, 2, 16, 8))


@pytest.fixture
def small_matmul(monkeypatch):
    """The timed matmul behind the fake GPUs runs on this CPU: at the GPU's size (8192, bf16) that
    is minutes. Its size is not what those tests are about."""
    monkeypatch.setattr(autotune.measure.doctor, "MATMUL_SIZE", {"cuda": 64, "cpu": 64})


def doctor(*args: str) -> tuple[int, dict | str]:
    result = CliRunner().invoke(main, ["doctor", *args])
    return result.exit_code, json.loads(result.stdout) if "--json" in args else result.stdout


@pytest.mark.slow
def test_doctor_on_this_cpu_says_what_it_can(quick_compile):
    code, report = doctor("--json")
    assert code == 0 and report["ok"] and report["problems"] == []
    assert report["versions"]["torch"] == torch.__version__
    assert report["versions"]["torch_cuda"] == torch.version.cuda  # None on a CPU build, a CUDA build's own
    assert report["versions"]["driver"] is None  # no NVML on this machine
    assert report["device"]["kind"] == "cpu" and report["device"]["device"] == "cpu"
    assert report["memory"]["source"] == "rss"
    for dtype in ("bfloat16", "float16"):
        assert report["sdpa"][dtype]["math"] == "runs" and report["sdpa"][dtype]["flash"] == "runs"
        assert report["sdpa"][dtype]["cudnn"] == report["sdpa"][dtype]["efficient"] == "a CUDA kernel"
    assert report["peak_flops"] == {"by_dtype": None, "source": "a CPU: MFU is not reported"}
    matmul = report["matmul"]  # timed here: float32 on a CPU
    assert (matmul["dtype"], matmul["size"], matmul["detail"]) == ("float32", 512, None) and matmul["flops_per_sec"] > 0


def test_doctor_text_is_a_short_account(quick_compile, small_sdpa):
    code, text = doctor()
    assert code == 0
    assert "  torch                 " + torch.__version__ in text
    assert "  torch.compile         works" in text
    assert "  SDPA bfloat16         flash, math" in text
    assert "  matmul float32        " in text and " TFLOP/s measured here (512x512)" in text
    assert text.rstrip().endswith("ok: this machine can run a study")


@pytest.mark.cuda_fakes
def test_doctor_on_a_gpu_in_a_container(monkeypatch, small_sdpa, small_matmul):
    monkeypatch.setattr(autotune.measure.doctor, "_triton_version", lambda: None)  # as on a CPU build
    machine = FakeMachine([FakeGpu(others_used=2 * 1024**3)], container=True)
    with fake_gpu_machine(monkeypatch, machine):
        code, report = doctor("--json")
    assert report["device"]["name"] == "NVIDIA H200" and report["device"]["device"] == "cuda:0"
    assert report["device"]["mig"] == "disabled"
    assert report["versions"]["driver"] == "570.124.06" and report["versions"]["driver_cuda"] == "12.8"
    assert report["memory"]["in_container"] is True and report["memory"]["source"] == "nvml-device"
    assert os.getpid() not in report["memory"]["nvml_pids"]
    assert report["memory"]["context_bytes"] == machine.context_bytes  # the other processes' 2 GiB are not ours
    assert report["peak_flops"]["by_dtype"]["bfloat16"] == 989e12 and "H200 datasheet" in report["peak_flops"]["source"]
    # A bf16 matmul timed on the device, beside the datasheet's 989 and a real H200's 790 TFLOP/s.
    matmul = report["matmul"]
    assert matmul["dtype"] == "bfloat16" and matmul["flops_per_sec"] > 0
    assert (matmul["datasheet_flops_per_sec"], matmul["measured_elsewhere_flops_per_sec"]) == (989e12, 790e12)
    # No triton: compile cannot work on CUDA, and that is a problem (exit 1).
    assert report["compile"]["ok"] is False and "triton" in report["compile"]["detail"]
    assert code == 1 and any("every compiled trial would crash" in p for p in report["problems"])


@pytest.mark.cuda_fakes
def test_doctor_on_a_mig_instance_on_the_host(monkeypatch, quick_compile, small_sdpa, small_matmul):
    mig = FakeMig("MIG-aaaaaaaa-1111-5555-9999-000000000001")
    with fake_gpu_machine(monkeypatch, FakeMachine([FakeGpu(migs=[mig])]), visible=mig.uuid):
        code, report = doctor("--json")
        _, text = doctor()
    assert code == 0, report["problems"]
    assert report["device"]["name"] == "NVIDIA H200 MIG 1g.18gb" and report["device"]["mig"] == "a MIG instance"
    assert report["memory"]["in_container"] is False and report["memory"]["source"] == "nvml-process"
    assert report["peak_flops"]["by_dtype"] is None and "MIG instance" in report["peak_flops"]["source"]
    assert f"NVML lists this process (PID {os.getpid()}): its per-process figure" in text
    assert "  MIG                   a MIG instance" in text and "  container             no" in text


@pytest.mark.cuda_fakes
def test_doctor_names_a_mig_gpu_handed_whole_as_the_problem(monkeypatch, quick_compile, small_sdpa, small_matmul):
    machine = FakeMachine([FakeGpu(migs=[FakeMig("MIG-aaaaaaaa-1111-5555-9999-000000000001")])])
    with fake_gpu_machine(monkeypatch, machine):
        code, report = doctor("--json")
    assert code == 1
    assert report["problems"][0].startswith("GPU 0 (GPU-0a1b2c3d-0000-4000-8000-000000000001) is in MIG mode")
    assert report["device"]["kind"] == "cpu"  # what it could still check


def test_doctor_without_a_c_compiler_says_so_without_compiling(monkeypatch, small_sdpa):
    import torch

    monkeypatch.setenv("CC", "/nonexistent/cc")
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda *a, **k: compiled.append(a))
    code, report = doctor("--json")
    assert code == 1
    assert report["compile"] == {
        "ok": False,
        "detail": "no C compiler (gcc, cc or clang, or $CC): install one (apt install gcc)",
        "seconds": report["compile"]["seconds"],
    }
    assert compiled == []  # refused before anything compiled


@pytest.mark.compile
def test_the_compile_check_compiles_for_real_every_time():
    """A check that a cache answers proves nothing about the compiler: the tiny function's
    random constant was a dynamo graph input (floats are not specialized), so its kernel was the
    same in every run and inductor's caches, on disk and in the process, answered from the
    second on, the C compiler never called. Each check's kernel is new now: it compiles.

    In a fresh interpreter, compiling in-process (one compile thread), with its generator seeded
    the same before each check: what a test worker's state (a warm pool of compile workers, whose
    builds no patch here sees; a seeded generator) must not decide."""
    script = """
import random, torch._inductor.cpp_builder as cpp_builder
from autotune.device import describe
from autotune.measure.doctor import check_compile
builds, real = [], cpp_builder.run_compile_cmd
cpp_builder.run_compile_cmd = lambda *a, **k: builds.append(a) or real(*a, **k)
for _ in range(2):
    builds.clear()
    random.seed(0)
    check = check_compile("cpu", describe("cpu"))
    assert check.ok, check.detail
    assert builds, "the C compiler was not called: a cache answered"
"""
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONPATH": str(Path(autotune.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
