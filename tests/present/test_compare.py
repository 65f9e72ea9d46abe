"""autotune.present.compare and `autotune compare`: the table, JSON and Markdown, knob
importance, and each study's best applied to the other. The studies (`compare_studies`): a CPU
study, and a second one warm-started from it and relabelled as an A100's; a synthetic GPU
study covers what a CPU does not produce. No assertion is about speed: the CPU is shared."""

from __future__ import annotations

import json

import pytest

from autotune.config import normalize_config_dict
from autotune.present.compare import comparison_markdown, comparison_text, load_comparison
from autotune.present.importance import knob_importance
from tests.helpers import DISTS, invoke, synthetic_study

pytestmark = pytest.mark.process  # compare_studies runs two searches


def test_compare_table(studies):
    result = invoke("compare", str(studies / "a.db"), str(studies / "b.db"))
    assert result.exit_code == 0, result.output
    text = result.output
    print(text)
    header = text.splitlines()[0].split()
    assert header == ["a", "b"]
    comp = load_comparison([str(studies / "a.db"), str(studies / "b.db")])
    assert comp.views[0].hardware["name"] in text and "host RAM" in text  # the CPU study
    assert "NVIDIA A100-SXM4-80GB" in text and "80.00 GiB" in text and "12.4 / 550.54" in text
    for row in (
        "effective tokens/s",
        "MFU",
        "peak memory / limit",
        "speedup vs baseline",
        "speedup vs checklist",
        "important knob 1",
        "trials",
    ):
        assert row in text
    # every knob of the best configurations has a row; those that differ carry the mark
    for knob in comp.knobs:
        marked = f"* {knob}" in text
        assert marked == (knob in comp.differ), knob
    # counts by outcome, as recorded
    for view in comp.views:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(view.summary.counts.items(), key=lambda kv: (-kv[1], kv[0])))
        assert f"{len(view.summary.trials)}: {counts}" in text
    assert "a's best (#" in text and "b's best (#" in text


def test_compare_importance_and_fallback(studies):
    comp = load_comparison([str(studies / "a.db"), str(studies / "b.db")])
    a, b = comp.views
    # b searched a single configuration: too few to rank, said so
    assert b.importance.values is None and "too few trials" in b.importance.note
    assert a.importance.values is None and a.importance.n_trials <= 3
    # with enough searched trials the knobs are ranked (the synthetic GPU study's 22 of 30; its
    # default 17 of 24 are too few since issue D, #3)
    gpu = knob_importance(synthetic_study("sqlite:///:memory:", n=30))
    assert gpu.values and abs(sum(gpu.values.values()) - 1) < 1e-6 and gpu.note is None
    assert set(gpu.values) <= set(DISTS)


def test_compare_json_and_markdown(studies):
    result = invoke("compare", str(studies / "a.db"), str(studies / "b.db"), "--json")
    data = json.loads(result.output)
    assert set(data) == {"studies", "knobs", "cross", "notes"}
    a, b = data["studies"]
    assert b["hardware"]["name"] == "NVIDIA A100-SXM4-80GB"
    for key in (
        "label",
        "study",
        "storage",
        "hardware",
        "torch",
        "model",
        "memory_limit_bytes",
        "best",
        "speedup_vs_baseline",
        "speedup_vs_checklist",
        "importance",
        "importance_note",
        "counts",
        "n_trials",
    ):
        assert key in a
    assert set(a["best"]) == {
        "trial",
        "config",
        "tokens_per_sec",
        "tokens_per_sec_runs",
        "tokens_per_sec_ci95",
        "joules_per_token",
        "energy_note",
        "mfu",
        "peak_memory_bytes",
    }
    assert a["speedup_vs_baseline"] > 0 and a["counts"]
    assert set(data["knobs"]) == {"all", "differ"}
    assert {(c["source"], c["target"]) for c in data["cross"]} == {("a", "b"), ("b", "a")}
    assert data["notes"] == []  # same model, data and context length

    result = invoke("compare", str(studies / "a.db"), str(studies / "b.db"), "--markdown")
    lines = result.output.splitlines()
    assert lines[0] == "|  | a | b |" and lines[1] == "|---|---|---|"
    assert any(line.startswith("| effective tokens/s |") for line in lines)
    assert invoke("compare", str(studies / "a.db"), "--json", "--markdown").exit_code == 2


def test_cross_application(studies):
    comp = load_comparison([str(studies / "a.db"), str(studies / "b.db")])
    by_pair = {(c.source, c.target): c for c in comp.cross}
    for view, other in (comp.views, comp.views[::-1]):
        result = by_pair[(view.label, other.label)]
        best = view.summary.best.config
        assert result.source_trial == view.summary.best.number
        there = other.summary.trials[result.trial].config
        if result.match == "exact":
            assert there == best and result.differs == []
            assert "same configuration" in result.text()
        else:
            assert result.match == "nearest" and result.differs
            assert [k for k in best if best[k] != there[k]] == result.differs
            assert f"nearest: #{result.trial}, differs in {', '.join(result.differs)}" in result.text()
            # no measured trial there is closer
            measured = [t for t in other.summary.trials if t.measured]
            closest = min(sum(best[k] != t.config[k] for k in best) for t in measured)
            assert len(result.differs) == closest


def test_compare_different_models_warns(studies, tmp_path):
    synthetic_study(f"sqlite:///{tmp_path}/h200.db")
    comp = load_comparison([str(studies / "a.db"), str(tmp_path / "h200.db")])
    text = comparison_text(comp)
    assert "different models (gpt2, gpt2-tiny)" in text
    assert "a's best (#" in text and "in gpt2-nvidia-h200: nearest: #" in text  # no exact match there
    assert "* token_budget" in text and "token_budget" in comp.differ  # 1024/2048 here, 8192+ there
    # a knob whose best value is the same in both is listed unmarked (batching when both bests are
    # padded, num_workers 0 in both, ...): which knobs those are follows from the two bests
    a_best, h200_best = (normalize_config_dict(view.best_config) for view in comp.views)
    same = [knob for knob in comp.knobs if a_best.get(knob) == h200_best.get(knob)]
    assert same and all(f"  {knob}" in text and knob not in comp.differ for knob in same), (same, comp.differ)
    assert "H200" in text and "139.70 GiB" in text
    assert "**Note:**" in comparison_markdown(comp)
