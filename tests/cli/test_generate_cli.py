"""`autotune bench --task generate` in this process, and a whole `search --task generate` through
the CLI, then `verify` and `export` of its recipe, as processes."""

from __future__ import annotations

import ast
import json

import pytest
from click.testing import CliRunner

from autotune.cli import main
from tests.helpers import recorded_imports, recording_imports, run_autotune

QUICK = ["--model", "gpt2-tiny", "--device", "cpu", "--prompt-len", "8", "--new-tokens", "4"]
TIMED = ["--steps", "2", "--warmup", "0", "--min-time", "0"]


def test_bench_generate_json_holds_the_generation_figures():
    result = CliRunner().invoke(
        main,
        ["bench", "--task", "generate", *QUICK, *TIMED, "--set", "kv_cache=static", "--set", "batch_size=2", "--json"],
    )
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)
    assert m["outcome"] == "ok" and m["config"]["kv_cache"] == "static"
    g = m["generation"]
    assert g["batch_size"] == 2 and g["cache_length"] == 12 and g["agreement"]["agreed_min"] == 4
    assert m["tokens_per_sec"] == g["output_tokens_per_sec"]


def test_bench_generate_refuses_cuda_graphs_on_a_cpu_with_the_reason_and_bad_knobs_in_one_line():
    runner = CliRunner()
    result = runner.invoke(
        main,
        ["bench", "--task", "generate", *QUICK, "--set", "kv_cache=static", "--set", "decode_compile=reduce-overhead"],
    )
    assert result.exit_code == 1 and "unsupported" in result.output
    assert "reduce-overhead means CUDA graphs, which need a CUDA device" in result.output
    bad = runner.invoke(main, ["bench", "--task", "generate", *QUICK, "--set", "amp_dtype=bfloat16"])
    assert bad.exit_code == 2 and "unknown knob 'amp_dtype' in --set; valid knobs: kv_cache" in bad.output
    train = runner.invoke(main, ["bench", "--task", "generate", *QUICK, "--batching", "packed"])
    assert train.exit_code == 2 and "--batching is an option of --task train" in train.output


@pytest.mark.process
def test_search_generate_then_verify_and_export_through_the_cli(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("short one\na somewhat longer prompt\n")
    workload = ["--model", "gpt2-tiny", "--device", "cpu", "--prompts", str(prompts), "--new-tokens", "4"]
    quick = ["--n-trials", "2", "--no-references", "--no-confirm", "--fix", "decode_compile=none", *TIMED]
    imports = tmp_path / "imports"
    imports.mkdir()
    searched = run_autotune(
        "search", "--task", "generate", *workload, *quick, "--json", cwd=tmp_path, env=recording_imports(imports)
    )
    assert searched.returncode == 0, searched.stderr
    summary = json.loads(searched.stdout)
    assert summary["study"] == "gpt2-tiny-generate-cpu" and summary["task"] == "generate"
    assert summary["front"] and summary["best"]["measurement"]["generation"]["agreement"]["agreed_min"] == 4
    # The tuner imports no torch (its trials and the prompts' reader do, in their own processes).
    tuners = [r for r in recorded_imports(imports) if r["argv"][1:2] == ["search"]]
    assert len(tuners) == 1 and tuners[0]["torch"] is False, tuners
    recipe = tmp_path / "recipes" / "gpt2-tiny-generate-cpu.json"
    assert json.loads(recipe.read_text())["workload"]["prompt_lens"] == [9, 24]  # the file's, in bytes
    # On this CPU, as it was measured (auto asks torch for a GPU where NVML is missing: seconds more)
    verified = run_autotune(
        "verify", str(recipe), "--device", "cpu", "--tolerance", "0.95", *TIMED, "--json", cwd=tmp_path
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    result = json.loads(verified.stdout)
    assert result["passed"] and result["measured"]["generation"]["new_tokens"] == 4
    exported = run_autotune("export", str(recipe), "--format", "hf-generate", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    ast.parse(exported.stdout)
    assert "generation_config = GenerationConfig(" in exported.stdout and "max_new_tokens=4," in exported.stdout
