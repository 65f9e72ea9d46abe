"""`autotune search --nproc-per-node N`: what it refuses before anything runs, and a whole 2-rank
search through the CLI (gpt2-tiny, gloo, one trial) whose recipe `autotune verify` reruns on
2 ranks."""

from __future__ import annotations

import json

import pytest

from autotune.errors import UsageError
from tests.helpers import FAST, TINY_SPACE, invoke

TWO_RANK_SPACE = """version: 1
dimensions:
  parallelism: {choices: [ddp, fsdp2]}
  token_budget: {choices: [512]}
  batching: {choices: [packed]}
"""


def test_a_space_that_does_not_say_how_ranks_share_the_model_is_refused(tmp_path):
    result = invoke(
        "search", "--model", "gpt2-tiny", *FAST, "--nproc-per-node", "2", "--space", str(TINY_SPACE),
        "--storage", f"sqlite:///{tmp_path}/s.db",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "neither searches nor fixes parallelism (ddp, fsdp2)" in result.stderr
    assert not (tmp_path / "s.db").exists()


def test_devices_and_ranks_are_refused_together(tmp_path):
    result = invoke("search", "--model", "gpt2-tiny", *FAST, "--nproc-per-node", "2", "--devices", "0,1")
    assert result.exit_code == 2 and "use one or the other" in result.stderr, result.output


def test_the_global_batch_is_across_the_ranks(tmp_path):
    space = tmp_path / "ddp.yaml"
    space.write_text(TWO_RANK_SPACE)
    # 512 divides 512, but 512 x 2 ranks does not: every trial would be refused
    result = invoke(
        "search", "--model", "gpt2-tiny", *FAST, "--nproc-per-node", "2", "--space", str(space),
        "--global-batch-tokens", "512", "--storage", f"sqlite:///{tmp_path}/s.db",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "times the 2 ranks divides it" in result.stderr


@pytest.mark.process
def test_a_two_rank_search_writes_a_recipe_that_verify_reruns_on_two_ranks(tmp_path):
    space = tmp_path / "ddp.yaml"
    space.write_text(TWO_RANK_SPACE)
    recipe = tmp_path / "r.json"
    # One trial (a launch of 2 ranks, ~12 s): every figure checked below is the best's, and the
    # single-rank reference is measured for whichever trial is the best
    result = invoke(
        "search", "--model", "gpt2-tiny", *FAST, "--space", str(space), "--nproc-per-node", "2",
        "--n-trials", "1", "--no-references", "--no-confirm", "--trial-timeout", "240s",
        "--storage", f"sqlite:///{tmp_path}/s.db", "--study", "ranks", "--recipe", str(recipe), "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["world_size"] == 2
    assert summary["per_device_tokens_per_sec"] == pytest.approx(summary["global_tokens_per_sec"] / 2)
    assert summary["straggler_ratio"] >= 1.0
    single = summary["single_rank_reference"]  # the best on one rank, for the scaling efficiency
    assert single["trial"] == summary["best"]["number"] and single["config"]["parallelism"] == "none"
    assert summary["scaling_efficiency"] == pytest.approx(
        summary["global_tokens_per_sec"] / (2 * single["tokens_per_sec"])
    )
    saved = json.loads(recipe.read_text())
    assert saved["batch"]["world_size"] == 2 and saved["config"]["parallelism"] in ("ddp", "fsdp2")
    assert saved["measured"]["world_size"] == 2 and saved["measured"]["scaling_efficiency"] > 0

    verified = invoke("verify", str(recipe), "--tolerance", "99%", "--json", *FAST)
    assert verified.exit_code == 0, verified.output
    data = json.loads(verified.stdout)
    assert data["passed"] is True and data["outcome"] == "ok"
    assert data["measured"]["world_size"] == 2  # relaunched on 2 ranks


TWO_GPUS = [
    {"uuid": "GPU-0a1b2c3d-0000-4000-8000-000000000001"},
    {"uuid": "GPU-0a1b2c3d-0000-4000-8000-000000000002", "speed": 9},
]


@pytest.mark.cuda_fakes
@pytest.mark.parametrize(("gpus", "refused"), [(1, True), (2, False)])
def test_ranks_on_cuda_are_checked_against_the_visible_gpus(gpus, refused, tmp_path, monkeypatch):
    """On a one-GPU host every trial of --nproc-per-node 2 would crash: refused before anything
    runs. With the GPUs there, `--device cuda` (resolved to cuda:0) is taken, not refused as if the
    user had named one device."""
    from autotune.search.settings import SearchSettings
    from autotune.search.training import _check_ranks
    from autotune.space.file import load_space
    from tests.cuda_fakes import FakeGpu, FakeMachine, fake_gpu_machine

    space_file = tmp_path / "ranks.yaml"
    space_file.write_text(TWO_RANK_SPACE)
    settings = SearchSettings(model="gpt2-tiny", device="cuda", nproc_per_node=2)
    machine = FakeMachine([FakeGpu(**g) for g in TWO_GPUS[:gpus]])
    with fake_gpu_machine(monkeypatch, machine):
        if refused:
            with pytest.raises(UsageError, match=r"--nproc-per-node 2 runs a rank per GPU, and this process sees 1"):
                _check_ranks(settings, load_space(space_file), "cuda:0")
        else:
            _check_ranks(settings, load_space(space_file), "cuda:0")
