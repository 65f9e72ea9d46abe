"""`bench --set` takes the new knobs and records them; an impossible one is `unsupported`."""

from __future__ import annotations

import json

import pytest

from tests.helpers import invoke


def bench(*sets: str) -> tuple[int, dict]:
    args = ["bench", "--model", "gpt2-tiny", "--device", "cpu", "--warmup", "1", "--steps", "2", "--min-time", "0"]
    for s in sets:
        args += ["--set", s]
    result = invoke(*args, "--json")
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.slow
def test_bench_set_new_knobs():
    code, data = bench("batching=packed", "loss_impl=chunked", "token_budget=1024")
    assert code == 0 and data["outcome"] == "ok"
    assert data["config"]["loss_impl"] == "chunked" and data["config"]["batching"] == "packed"
    assert data["padding_fraction"] == 0
    code, data = bench("batching=packed", "attention_mask=document")
    assert code == 1 and data["outcome"] == "unsupported"
    assert data["reason"].startswith("attention_mask: document masks run on FlexAttention, which has no backward")


def test_bench_rejects_a_scope_without_compile():
    result = invoke("bench", "--set", "compile_scope=model")
    assert result.exit_code == 2
    assert "compile_scope=model needs a compile_mode other than none (nothing is compiled)" in result.stderr
