"""`bench --set` takes the new knobs and records them; an impossible one is `unsupported`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process


def bench(*sets: str) -> tuple[int, dict]:
    args = [
        sys.executable,
        "-m",
        "autotune",
        "bench",
        "--model",
        "gpt2-tiny",
        "--device",
        "cpu",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--min-time",
        "0",
        "--json",
    ]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    return proc.returncode, json.loads(proc.stdout)


def test_bench_set_new_knobs():
    code, data = bench("batching=packed", "loss_impl=chunked", "token_budget=1024")
    assert code == 0 and data["outcome"] == "ok"
    assert data["config"]["loss_impl"] == "chunked" and data["config"]["batching"] == "packed"
    assert data["padding_fraction"] == 0
    code, data = bench("batching=packed", "attention_mask=document")
    assert code == 1 and data["outcome"] == "unsupported"
    assert data["reason"].startswith("attention_mask: document masks run on FlexAttention, which has no backward")


def test_bench_rejects_a_scope_without_compile():
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "bench", "--set", "compile_scope=model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "compile_scope=model needs a compile_mode other than none (nothing is compiled)" in proc.stderr
