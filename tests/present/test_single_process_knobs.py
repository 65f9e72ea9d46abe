"""A single-process study lists no multi-rank knob (issue D, #8): parallelism, bucket_cap_mb,
gradient_as_bucket_view, static_graph, reshard_after_forward and reduce_dtype (`ranks_only`)
do nothing in one process, and `show`, `report`, the search's summary and `compare` listed them
among the best's knobs. A study of several ranks still lists them."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from autotune import registry
from autotune.present.summaries import best_table
from autotune.study.summary import summarize
from tests.helpers import invoke, synthetic_study

RANKS_ONLY = [k.name for k in registry.knobs_of(registry.TRAIN) if k.ranks_only]


def named(text: str) -> list[str]:
    return [name for name in RANKS_ONLY if name in text]


@pytest.mark.slow
def test_a_single_process_study_names_no_multi_rank_knob(tmp_path):
    assert len(RANKS_ONLY) == 6
    url = f"sqlite:///{tmp_path / 's.db'}"
    synthetic_study(url, "one")
    synthetic_study(url, "two")
    show = invoke("show", "--study", "one", "--storage", url)
    assert show.exit_code == 0 and "best: trial #" in show.output
    assert named(show.output) == []
    report = invoke("report", "--study", "one", "--storage", url, "--out", str(tmp_path / "report"))
    assert report.exit_code == 0, report.output
    assert named((tmp_path / "report" / "report.md").read_text()) == []
    compare = invoke("compare", f"{url}#one", f"{url}#two")
    assert compare.exit_code == 0, compare.output
    assert named(compare.output) == []


@pytest.mark.slow
def test_a_study_of_two_ranks_still_names_them(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    synthetic_study(url, "ddp")
    summary = summarize(optuna.load_study(study_name="ddp", storage=url))
    best = dataclasses.replace(summary.best, config={**summary.best.config, "parallelism": "ddp", "bucket_cap_mb": 50})
    text = best_table(dataclasses.replace(summary, best=best))
    assert named(text) == RANKS_ONLY and "bucket_cap_mb            50" in text
