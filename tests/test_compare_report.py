"""`autotune compare`, `report`, `dashboard` and `search --warm-start-from`.

Two real studies are searched once for the module (gpt2-tiny on this CPU, a tiny space
without compile in the search, 4 timed steps); the second one's hardware record is then
swapped for an A100's, as if it had been tuned there. A synthetic GPU study (no model run)
covers the outcomes a CPU does not produce (OOM, over the limit, unsupported).
No assertion is about speed: the CPU is shared."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import random
import sys
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from autotune.cli import main
from autotune.present.compare import comparison_markdown, comparison_text, load_comparison
from autotune.present.importance import knob_importance
from autotune.search.storage import load_ref, split_ref
from autotune.search.warm_start import enqueue_warm_start, invalid_here, warm_start_candidates
from autotune.config import TrainConfig
from autotune.device import DeviceInfo
from autotune.errors import UsageError
from autotune.search.run import SearchSettings, prepare, run_search
from autotune.search.study import summarize

REPO = Path(__file__).resolve().parent.parent
SPACE = str(REPO / "tests" / "spaces" / "compare.yaml")
A100 = {"kind": "cuda", "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-0000", "index": 0,
        "total_memory_bytes": 85_899_345_920, "compute_capability": "8.0", "driver": "550.54", "cuda": "12.4",
        "torch": "2.13.0+cu124", "cpu_count": 32}
GiB = 2 ** 30

optuna.logging.set_verbosity(optuna.logging.WARNING)


def settings(tmp: Path, name: str, **kwargs) -> SearchSettings:
    base = dict(model="gpt2-tiny", device="cpu", space=SPACE, steps=4, warmup=1, storage=f"sqlite:///{tmp}/{name}.db",
                study=name, recipe=str(tmp / "recipes" / f"{name}.json"))
    return SearchSettings(**{**base, **kwargs})


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


WARM_EXPECTED: list[tuple[int, dict]] = []  # (trial number in a, config) b was warm-started with


@pytest.fixture(scope="module")
def studies(tmp_path_factory) -> Path:
    """a.db: study "a" (CPU, 5 trials); b.db: study "b", warm-started from a (3 trials: its
    references, then a's best searched configuration; a's next best wait in its queue),
    then relabelled as an A100's; both.db: copies of the two, for the #study syntax."""
    tmp = tmp_path_factory.mktemp("studies")
    run_search(settings(tmp, "a", n_trials=5, seed=0))
    WARM_EXPECTED[:] = [(t.number, t.user_attrs["config"]) for t in warm_start_candidates(load_ref(str(tmp / "a.db")), 5)]
    b = run_search(settings(tmp, "b", n_trials=3, seed=1, warm_start_from=str(tmp / "a.db"))).study
    b.set_user_attr("hardware", A100)
    for name in ("a", "b"):
        optuna.copy_study(from_study_name=name, from_storage=f"sqlite:///{tmp}/{name}.db",
                          to_storage=f"sqlite:///{tmp}/both.db")
    return tmp


# --- a synthetic GPU study: every outcome, without running a model ----------------------------

DISTS = {"token_budget": CategoricalDistribution([8192, 16384, 32768]),
         "amp_dtype": CategoricalDistribution(["float32", "bfloat16"]),
         "sdpa_backend": CategoricalDistribution(["math", "flash"]),
         "checkpoint_count": IntDistribution(0, 12)}


def synthetic_study(storage: str, name: str = "gpt2-nvidia-h200", n: int = 24, limit: int = 40 * GiB) -> optuna.Study:
    rnd = random.Random(0)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    hardware = {**A100, "name": "NVIDIA H200", "total_memory_bytes": 150_000_000_000, "compute_capability": "9.0"}
    for key, value in {"hardware": hardware, "model": "gpt2", "seq_len": 1024, "n_layer": 12, "data": "synthetic",
                       "memory_limit_bytes": limit}.items():
        study.set_user_attr(key, value)
    every_outcome = [  # over the limit, out of memory, unsupported; then random ones
        {"token_budget": 32768, "amp_dtype": "float32", "sdpa_backend": "math", "checkpoint_count": 3},
        {"token_budget": 32768, "amp_dtype": "float32", "sdpa_backend": "math", "checkpoint_count": 0},
        {"token_budget": 8192, "amp_dtype": "float32", "sdpa_backend": "flash", "checkpoint_count": 0},
    ]
    for number in range(n):
        p = every_outcome[number] if number < len(every_outcome) else {
            k: (rnd.choice(d.choices) if isinstance(d, CategoricalDistribution) else rnd.randint(d.low, d.high))
            for k, d in DISTS.items()}
        cfg = TrainConfig(token_budget=p["token_budget"], amp_dtype=p["amp_dtype"], sdpa_backend=p["sdpa_backend"],
                          checkpoint_layers=tuple(range(p["checkpoint_count"]))).to_dict()
        bf16 = cfg["amp_dtype"] == "bfloat16"
        rate = 20000 * (2.2 if bf16 else 1) * (1.3 if cfg["sdpa_backend"] == "flash" else 1) * rnd.uniform(0.9, 1.1)
        peak = int(cfg["token_budget"] / 1024 * (1.0 if bf16 else 2.0) * (1 - 0.05 * p["checkpoint_count"]) * GiB)
        attrs = {"config": cfg}
        common = dict(params=p, distributions=DISTS, user_attrs=attrs)
        if cfg["sdpa_backend"] == "flash" and not bf16:
            attrs.update(outcome="unsupported", reason="sdpa_backend: flash attention needs float16 or bfloat16")
            study.add_trial(create_trial(state=TrialState.PRUNED, **common))
        elif peak > 1.5 * limit:
            attrs.update(outcome="oom", reason="out of memory")
            study.add_trial(create_trial(value=0.0, constraints={"memory": 1.0}, **common))
        else:
            m = {"tokens_per_sec": rate, "peak_memory_bytes": peak, "peak_memory_source": "nvml", "mfu": 0.3}
            attrs.update(outcome="ok" if peak <= limit else "over_memory_limit", measurement=m, tokens_per_sec=rate,
                         peak_memory_bytes=peak)
            study.add_trial(create_trial(value=rate, constraints={"memory": (peak - limit) / limit}, **common))
    return study


# --- REFs ---------------------------------------------------------------------------------------


def test_split_ref():
    assert split_ref("studies/x.db") == ("studies/x.db", None)
    assert split_ref("studies/x.db#gpt2-h200") == ("studies/x.db", "gpt2-h200")
    assert split_ref("postgresql://tuner@db/autotune#gpt2-h200") == ("postgresql://tuner@db/autotune", "gpt2-h200")


def test_a_storage_with_several_studies_needs_a_name(studies):
    with pytest.raises(UsageError, match=r"holds 2 studies; name one as .*#NAME: a, b"):
        load_ref(str(studies / "both.db"))
    assert load_ref(f"{studies}/both.db#b").study_name == "b"
    with pytest.raises(UsageError, match="no study 'c'"):
        load_ref(f"{studies}/both.db#c")
    result = invoke("compare", str(studies / "both.db"), str(studies / "a.db"))
    assert result.exit_code == 2 and "a, b" in result.output
    result = invoke("compare", f"{studies}/both.db#a", f"{studies}/both.db#b", "--json")
    assert result.exit_code == 0, result.output
    assert [s["study"] for s in json.loads(result.output)["studies"]] == ["a", "b"]


def test_a_missing_file_is_a_usage_error(tmp_path):
    result = invoke("compare", str(tmp_path / "nope.db"))
    assert result.exit_code == 2 and "no such database file" in result.output
    assert not (tmp_path / "nope.db").exists()


def test_passwords_never_show():
    with pytest.raises(UsageError) as err:
        load_ref("postgresql://tuner:s3cret@127.0.0.1:1/autotune#x")
    assert "s3cret" not in str(err.value) and "***" in str(err.value)


# --- compare ------------------------------------------------------------------------------------


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
    for row in ("effective tokens/s", "MFU", "peak memory / limit", "speedup vs baseline", "speedup vs checklist",
                "important knob 1", "trials"):
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
    # with enough searched trials the knobs are ranked (the synthetic GPU study's 20)
    gpu = knob_importance(synthetic_study("sqlite:///:memory:").trials)
    assert gpu.values and abs(sum(gpu.values.values()) - 1) < 1e-6 and gpu.note is None
    assert set(gpu.values) <= set(DISTS)


def test_compare_json_and_markdown(studies):
    result = invoke("compare", str(studies / "a.db"), str(studies / "b.db"), "--json")
    data = json.loads(result.output)
    assert set(data) == {"studies", "knobs", "cross", "notes"}
    a, b = data["studies"]
    assert b["hardware"]["name"] == "NVIDIA A100-SXM4-80GB"
    for key in ("label", "study", "storage", "hardware", "torch", "model", "memory_limit_bytes", "best",
                "speedup_vs_baseline", "speedup_vs_checklist", "importance", "importance_note", "counts", "n_trials"):
        assert key in a
    assert set(a["best"]) == {"trial", "config", "tokens_per_sec", "mfu", "peak_memory_bytes"}
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
        best = view.summary.best.user_attrs["config"]
        assert result.source_trial == view.summary.best.number
        there = other.summary.trials[result.trial].user_attrs["config"]
        if result.match == "exact":
            assert there == best and result.differs == []
            assert "same configuration" in result.text()
        else:
            assert result.match == "nearest" and result.differs
            assert [k for k in best if best[k] != there[k]] == result.differs
            assert f"nearest: #{result.trial}, differs in {', '.join(result.differs)}" in result.text()
            # no measured trial there is closer
            measured = [t for t in other.summary.trials if t.user_attrs.get("outcome") in ("ok", "over_memory_limit")]
            closest = min(sum(best[k] != t.user_attrs["config"][k] for k in best) for t in measured)
            assert len(result.differs) == closest


def test_compare_different_models_warns(studies, tmp_path):
    synthetic_study(f"sqlite:///{tmp_path}/h200.db")
    comp = load_comparison([str(studies / "a.db"), str(tmp_path / "h200.db")])
    text = comparison_text(comp)
    assert "different models (gpt2, gpt2-tiny)" in text
    assert "a's best (#" in text and "in gpt2-nvidia-h200: nearest: #" in text  # no exact match there
    assert "* token_budget" in text and "token_budget" in comp.differ  # 1024/2048 here, 8192+ there
    assert "  batching" in text and "batching" not in comp.differ  # padded in both
    assert "H200" in text and "139.70 GiB" in text
    assert "**Note:**" in comparison_markdown(comp)


# --- warm start ---------------------------------------------------------------------------------


def test_warm_start_runs_the_other_studys_best_first(studies):
    assert WARM_EXPECTED  # a has feasible ok searched trials
    trials = load_ref(str(studies / "b.db")).trials
    # the new study measures its own references first, then the enqueued configurations
    assert [t.user_attrs.get("reference") for t in trials[:2]] == ["baseline", "checklist"]
    warm = [t for t in trials if "warm_start_from" in t.user_attrs]
    assert [t.user_attrs["warm_start_trial"] for t in warm] == [number for number, _ in WARM_EXPECTED]
    assert all(t.user_attrs["warm_start_from"] == str(studies / "a.db") for t in warm)
    ran = warm[0]
    assert ran.number == 2 and ran.state == TrialState.COMPLETE
    assert ran.user_attrs["config"] == WARM_EXPECTED[0][1]  # a's best searched configuration, exactly
    assert all(t.state == TrialState.WAITING for t in warm[1:])  # next in line when b is resumed
    # so a's best is found in b as the same configuration
    comp = load_comparison([str(studies / "a.db"), str(studies / "b.db")])
    a_best = comp.views[0].summary.best
    if a_best.number == WARM_EXPECTED[0][0]:
        cross = next(c for c in comp.cross if c.source == "a")
        assert cross.match == "exact" and cross.trial == 2


def test_warm_start_skips_what_cannot_run_here(studies, tmp_path, caplog):
    ctx, _, _ = prepare(settings(tmp_path, "x"))
    # a Volta GPU: no bf16, no flash -> every bf16 or flash configuration of a is skipped
    volta = dataclasses.replace(ctx, device=DeviceInfo(kind="cuda", name="Tesla V100", compute_capability="7.0"))
    source = load_ref(str(studies / "a.db"))
    candidates = warm_start_candidates(source, 5)
    runnable = [t for t in candidates if t.user_attrs["config"]["amp_dtype"] == "float32"
                and t.user_attrs["config"]["sdpa_backend"] != "flash"]
    study = optuna.create_study(direction="maximize")
    with caplog.at_level(logging.INFO, logger="autotune.compare"):
        n = enqueue_warm_start(study, str(studies / "a.db"), volta)
    assert n == len(runnable) == len(study.trials)
    if len(runnable) < len(candidates):
        assert "unsupported on this device" in caplog.text and f"skipped {len(candidates) - len(runnable)}" in caplog.text
    # configurations outside this space (the synthetic GPU study's budgets) are skipped, with the knob
    synthetic_study(f"sqlite:///{tmp_path}/h200.db")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="autotune.compare"):
        assert enqueue_warm_start(optuna.create_study(), str(tmp_path / "h200.db"), ctx) == 0
    assert "outside this search space (token_budget not among 1024, 2048)" in caplog.text
    assert "made for model gpt2" in caplog.text


def test_invalid_here_checks_the_space_exactly(tmp_path):
    ctx, _, _ = prepare(settings(tmp_path, "x"))
    ok = TrainConfig(token_budget=2048, amp_dtype="bfloat16", sdpa_backend="flash", batching="padded",
                     checkpoint_layers=(1,))
    reason, params = invalid_here(ok, ctx)
    assert reason == "" and params["checkpoint_count"] == 1 and params["token_budget"] == 2048
    assert "fixes batching=padded" in invalid_here(ok.replace(batching="packed"), ctx)[0]
    assert "compile_mode not among none" in invalid_here(ok.replace(compile_mode="default"), ctx)[0]


# --- report -------------------------------------------------------------------------------------


def check_images(out: Path) -> None:
    import matplotlib.image
    import numpy as np

    html = (out / "index.html").read_text()
    md = (out / "report.md").read_text()
    for name in ("history", "memory", "importance", "knobs"):
        path = out / f"{name}.png"
        pixels = matplotlib.image.imread(path)
        height, width = pixels.shape[:2]
        assert width >= 400 and height >= 300, (name, width, height)
        assert float(np.std(pixels)) > 0, name
        assert f'src="{name}.png"' in html and f"({name}.png)" in md
    assert "<script" not in html.lower()


def test_report_of_a_real_study(studies, tmp_path):
    out = tmp_path / "report-a"
    result = invoke("report", "--study", "a", "--storage", str(studies / "a.db"), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"open {out / 'index.html'}" in result.output
    check_images(out)
    html = (out / "index.html").read_text()
    best = summarize(load_ref(str(studies / "a.db"))).best
    assert f"Best configuration (trial #{best.number})" in html
    for knob, value in best.user_attrs["config"].items():
        assert f"<td>{knob}</td>" in html
    assert "<h2>Outcomes</h2>" in html and "autotune dashboard --study a" in html


def test_report_of_every_outcome(tmp_path):
    synthetic_study(f"sqlite:///{tmp_path}/h200.db")
    out = tmp_path / "reports" / "h200"
    result = invoke("report", "--storage", str(tmp_path / "h200.db"), "--out", str(out))
    assert result.exit_code == 0, result.output
    check_images(out)
    html = (out / "index.html").read_text()
    for outcome in ("ok", "oom", "over_memory_limit", "unsupported"):
        assert f"<td>{outcome}</td>" in html
    assert "Knob importance (" in html and "%</td>" in html


def test_report_of_an_unknown_study(studies, tmp_path):
    result = invoke("report", "--study", "zzz", "--storage", str(studies / "a.db"), "--out", str(tmp_path / "r"))
    assert result.exit_code == 2 and "no study 'zzz'" in result.output


# --- optuna-dashboard ---------------------------------------------------------------------------


def wsgi_get(app, path: str) -> tuple[str, bytes]:
    status: list[str] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "localhost",
               "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.input": io.BytesIO(b""),
               "wsgi.errors": io.StringIO(), "wsgi.url_scheme": "http"}
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], body


def test_optuna_dashboard_reads_our_studies_unchanged(studies):
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    from autotune.search.storage import open_storage

    study = load_ref(str(studies / "a.db"))
    for trial in study.trials:  # plain JSON values, as the dashboard needs them
        assert json.loads(json.dumps(trial.user_attrs)) == trial.user_attrs
    assert json.loads(json.dumps(study.user_attrs)) == study.user_attrs
    app = optuna_dashboard.wsgi(open_storage(str(studies / "a.db"), create=False))
    status, body = wsgi_get(app, "/api/studies")
    assert status.startswith("200")
    summaries = {s["study_name"]: s for s in json.loads(body)["study_summaries"]}
    status, body = wsgi_get(app, f"/api/studies/{summaries['a']['study_id']}")
    assert status.startswith("200")
    served = json.loads(body)
    assert len(served["trials"]) == len(study.trials)
    for mine, theirs in zip(study.trials, served["trials"]):
        attrs = {a["key"]: a["value"] for a in theirs["user_attrs"]}
        assert set(attrs) == set(mine.user_attrs)
        assert attrs["outcome"] == mine.user_attrs["outcome"]
        assert json.loads(attrs["config"]) == mine.user_attrs["config"]
        assert float(attrs["tokens_per_sec"]) == pytest.approx(mine.user_attrs["tokens_per_sec"])
        assert int(attrs["peak_memory_bytes"]) == mine.user_attrs["peak_memory_bytes"]
        # the dashboard shows long values cut (MAX_ATTR_LENGTH); the headline numbers are attrs of their own
        assert json.dumps(mine.user_attrs["measurement"]).startswith(attrs["measurement"])
    assert {"key": "tokens_per_sec", "sortable": True} in served["union_user_attrs"]
    assert {"key": "peak_memory_bytes", "sortable": True} in served["union_user_attrs"]


def test_dashboard_command(studies, monkeypatch):
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    calls = []
    monkeypatch.setattr(optuna_dashboard, "run_server", lambda storage, **kw: calls.append((storage, kw)))
    result = invoke("dashboard", "--study", "a", "--storage", str(studies / "a.db"), "--port", "8123")
    assert result.exit_code == 0, result.output
    assert calls and calls[0][1] == {"host": "127.0.0.1", "port": 8123}
    assert "http://127.0.0.1:8123/dashboard/studies/" in result.output

    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # as if not installed
    result = invoke("dashboard", "--study", "a", "--storage", str(studies / "a.db"))
    assert result.exit_code == 1 and "pip install optuna-dashboard" in result.output
