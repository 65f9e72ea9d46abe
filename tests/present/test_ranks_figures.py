"""A study of several ranks shows its own figures: the summary (text and --json), `compare` and
`report` give global and per-device tokens/s, the scaling efficiency against the best measured on
one rank, and the straggler ratio. Trials are faked
(no process): what is tested is what is read back and shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import main
from tests.attack_helpers import FAST, fake_trials

CPU_DDP = str(Path(__file__).resolve().parents[2] / "search_spaces" / "cpu_ddp.yaml")


def as_two_ranks(m, index):
    """Each faked run of the search's N-rank trials as 2 ranks measure it (the single-rank reference
    keeps world_size 1: its config has parallelism none)."""
    if m.config.get("parallelism", "none") == "none":
        return
    m.world_size = 2
    m.per_device_tokens_per_sec = m.tokens_per_sec / 2
    m.straggler_ratio = 1.25
    m.ranks = [
        {"rank": k, "tokens": 100, "window_s": 1.0 + k / 4, "data_wait_fraction": 0.01 * (k + 1)} for k in (0, 1)
    ]
    m.phase_s["rank_start"] = 1.5


@pytest.mark.slow
def test_a_two_rank_study_shows_global_per_device_scaling_and_straggler(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls: list = []
    fake_trials(monkeypatch, calls=calls, each=as_two_ranks)
    runner = CliRunner()
    searched = runner.invoke(
        main, ["search", *FAST, "--nproc-per-node", "2", "--space", CPU_DDP, "--n-trials", "3", "--json"]
    )
    assert searched.exit_code == 0, searched.output
    summary = json.loads(searched.stdout)
    best = summary["best"]["tokens_per_sec"]
    single = [spec for spec, cfg in calls if spec.nproc_per_node == 1]
    assert len(single) == 1 and all(cfg.parallelism != "none" for spec, cfg in calls if spec.nproc_per_node == 2)
    # the faked single rank measures the same tokens/s as the 2-rank trial: 1 / 2 of perfect scaling
    assert summary["scaling_efficiency"] == 0.5 and summary["per_device_tokens_per_sec"] == best / 2
    assert summary["straggler_ratio"] == 1.25 and summary["world_size"] == 2

    text = runner.invoke(main, ["search", *FAST, "--nproc-per-node", "2", "--space", CPU_DDP, "--n-trials", "1"])
    assert text.exit_code == 0, text.output
    for said in ("global tokens/s", "per-device tokens/s", "scaling efficiency       50.0%", "straggler ratio"):
        assert said in text.stdout, said

    compared = runner.invoke(main, ["compare", "studies/gpt2-tiny-cpu-2ranks.db"])
    assert compared.exit_code == 0, compared.output
    assert "scaling efficiency" in compared.stdout and "50.0%" in compared.stdout and "1.250" in compared.stdout
    compared_json = json.loads(runner.invoke(main, ["compare", "studies/gpt2-tiny-cpu-2ranks.db", "--json"]).stdout)
    assert compared_json["studies"][0]["scaling_efficiency"] == 0.5

    reported = runner.invoke(main, ["report", "--study", "gpt2-tiny-cpu-2ranks", "--out", str(tmp_path / "report")])
    assert reported.exit_code == 0, reported.output
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "scaling efficiency" in markdown and "per-device tokens/s" in markdown and "straggler ratio" in markdown
