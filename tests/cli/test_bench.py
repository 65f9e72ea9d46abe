"""`autotune bench`: the JSON contract, exit codes (0 ok, 1 a failed outcome, 2 bad input),
one-line error messages, and the human summary. One real subprocess run proves
`python -m autotune` works end to end; the rest run in-process through click's runner."""

from __future__ import annotations

import json

import pytest

from autotune.config import KNOBS
from tests.helpers import FAST, ROOT, invoke, run_autotune

JSON_KEYS = {
    "config",
    "outcome",
    "reason",
    "tokens_per_sec",
    "padded_tokens_per_sec",
    "padding_fraction",
    "step_time_median_s",
    "step_time_cv",
    "data_wait_fraction",
    "compile_time_s",
    "mfu",
    "peak_memory_bytes",
    "gpu_utilization",
    "tokens_per_sec_ci95",
    "joules_per_token",
    "energy_source",
    "energy_note",
    "device",
}


def bench(*args: str):
    return invoke("bench", "--model", "gpt2-tiny", "--device", "cpu", "--min-time", "0", *args)


def test_unsupported_config_is_json_and_exit_1():
    result = bench("--set", "sdpa_backend=efficient", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert JSON_KEYS <= set(data)
    assert data["outcome"] == "unsupported" and "sdpa_backend" in data["reason"]
    assert data["config"]["sdpa_backend"] == "efficient" and data["tokens_per_sec"] is None


def test_unsupported_config_human_output_names_the_knob():
    result = bench("--set", "pin_memory=true")
    assert result.exit_code == 1
    assert "unsupported" in result.stdout and "pin_memory" in result.stdout


@pytest.mark.slow
def test_human_output_shows_effective_tokens_and_applies_the_options():
    result = bench(
        "--steps",
        "2",
        "--warmup",
        "1",
        "--batching",
        "packed",
        "--set",
        "token_budget=1024",
        "--set",
        "checkpoint_layers=1",
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "gpt2-tiny on " in out and ": ok" in out
    assert "effective tokens/s" in out and "padded tokens/s" in out
    assert "batching=packed" in out and "budget=1024" in out and "ckpt=1" in out
    assert "(padding 0.0%)" in out  # packed batches really ran
    assert "MFU" in out and "n/a" in out


def test_invalid_knob_value_is_one_line_exit_2():
    result = bench("--set", "amp_dtype=fp8")
    assert result.exit_code == 2
    assert result.stderr == "Error: invalid value 'fp8' for amp_dtype: expected float32 | tf32 | float16 | bfloat16\n"
    assert result.stdout == ""


def test_malformed_set_names_the_form_exit_2():
    result = bench("--set", "nonsense")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: --set expects knob=value, got 'nonsense'")
    assert result.stderr.count("\n") == 1


def test_unknown_knob_exit_2():
    result = bench("--set", "bogus=1")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: unknown knob 'bogus'")
    assert all(knob in result.stderr for knob in KNOBS)  # lists the valid ones
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "nope"], "Error: unknown model 'nope'"),
        pytest.param(  # bench builds a user's factory in a trial process first (trial.probe)
            ["--model", "tests.fixture_models:missing"],
            "Error: model 'tests.fixture_models:missing'",
            marks=pytest.mark.process,
        ),
        (["--memory-limit", "lots"], "Error: --memory-limit: cannot read 'lots'"),
        (["--set", "checkpoint_layers=0,0"], "Error: checkpoint_layers has repeated block indices"),
        (["--set", "prefetch_factor=2"], "Error: prefetch_factor needs num_workers > 0"),
        (["--set", "token_budget=64"], "Error: token_budget 64 is smaller than the context length 128"),
        (["--set", "checkpoint_layers=5"], "Error: checkpoint_layers [5]: block 5 does not exist"),
    ],
)
def test_bad_input_exit_2(args, message):
    result = bench(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1  # one line, no traceback


@pytest.mark.process
def test_bench_json_stdout_stays_json_when_the_model_prints():
    """`python -m autotune bench --json` end to end, on gpt2-tiny printing to stdout when built and
    at every step, through print and through fd 1 as C code does (tests.fault_models:chatty): stdout
    is exactly the one JSON object with every field (the model's lines made it invalid JSON), and
    what the model printed is on stderr. At 1024 tokens a step (the default 8192 is 8x the work:
    the budget is not the subject)."""
    args = ("--model", "tests.fault_models:chatty", *FAST, "--set", "token_budget=1024", "--json")
    proc = run_autotune("bench", *args, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # stdout is exactly one JSON object, nothing else
    assert JSON_KEYS <= set(data)
    assert data["outcome"] == "ok" and data["reason"] is None
    assert data["tokens_per_sec"] > 0 and data["padded_tokens_per_sec"] >= data["tokens_per_sec"]
    assert 0 <= data["padding_fraction"] < 1 and data["step_time_median_s"] > 0
    assert data["mfu"] is None and data["gpu_utilization"] is None and data["peak_memory_bytes"] > 0
    assert data["device"]["kind"] == "cpu" and data["steps"] >= 4
    ci = data["tokens_per_sec_ci95"]  # null when the window has too few independent steps
    assert ci is None or ci[0] <= data["tokens_per_sec"] <= ci[1]
    # Energy per token where RAPL is readable, else null with the reason (this machine has none).
    assert (data["joules_per_token"] is None) == bool(data["energy_note"])
    assert data["config"] == {
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
        "persistent_workers": False,
        "token_budget": 1024,
        "batching": "padded",
        "amp_dtype": "float32",
        "compile_mode": "none",
        "compile_scope": "blocks",
        "sdpa_backend": "auto",
        "loss_impl": "standard",
        "attention_mask": "causal",
        "checkpoint_layers": [],
        "expandable_segments": False,
        "cpu_threads": 0,
        # the knobs of several ranks, at their defaults in a process of one (issue C)
        "parallelism": "none",
        "bucket_cap_mb": 25,
        "gradient_as_bucket_view": False,
        "static_graph": False,
        "reshard_after_forward": True,
        "reduce_dtype": "float32",
    }
    assert "chatty: built" in proc.stderr and "chatty: a step" in proc.stderr and "chatty: from C" in proc.stderr
