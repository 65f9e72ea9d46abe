"""`autotune search` end to end on gpt2-tiny and a CPU: the study and the recipe it writes,
resuming, show and export, every trial outcome (with models that fail on purpose, in
tests/fault_models.py), the outcome rules, and the CLI's errors.

Each trial is a real process (~4-10 s here): the tests keep to a tiny space, 4 timed steps,
and as few trials as prove the point. No assertion is about speed (the CPU is shared)."""

from __future__ import annotations

import dataclasses

import json
import os
import signal
import time
from pathlib import Path

import optuna
import pytest
import torch
from click.testing import CliRunner
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.errors import UnsupportedConfig
from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.recipe.recipe import Recipe
from autotune.search.objective import Objective, TrialFailed
from autotune.search.references import baseline_config, checklist_config
from autotune.search.run import SearchInterrupted, SearchSettings, prepare, run_search
from autotune.search.space_file import load_space
from autotune.search.storage import load_study
from autotune.search.study import is_feasible_ok, summarize
from autotune.trial.runner import TrialResult

REPO = Path(__file__).resolve().parent.parent
SPACES = REPO / "tests" / "spaces"
TINY = str(SPACES / "tiny.yaml")
FAST = ["--device", "cpu", "--steps", "4", "--warmup", "1"]
STUDY = "gpt2-tiny-cpu"
TINY_PARAMS = {"token_budget": 1024, "amp_dtype": "float32", "compile_mode": "none", "sdpa_backend": "math",
               "num_workers": 0, "checkpoint_count": 0}

# Optuna's log handler is bound to the stderr of its first use: make that pytest's, not a
# CliRunner stream that is closed when the command returns.
optuna.logging.set_verbosity(optuna.logging.WARNING)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def in_repo_env(monkeypatch) -> None:
    """Trial processes run in the test's tmp dir: let them import tests.fault_models."""
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    in_repo_env(monkeypatch)
    return tmp_path


def nothing_written(where: Path) -> bool:
    return not (where / "studies").exists() and not (where / "recipes").exists()


def settings(**kwargs) -> SearchSettings:
    base = dict(model="gpt2-tiny", device="cpu", space=TINY, steps=4, warmup=1)
    return SearchSettings(**{**base, **kwargs})


def run_objective(ctx, params: list[dict], objective: Objective | None = None) -> optuna.Study:
    """The search's objective on chosen configurations, in an in-memory study without the
    reference trials: the trial path of `run_search` (Objective -> runner -> trial process),
    only the configurations are picked by the test."""
    study = optuna.create_study(direction="maximize")
    for p in params:
        study.enqueue_trial(p)
    study.optimize(objective or Objective(ctx), n_trials=len(params), catch=(TrialFailed,))
    return study


# --- the main flow, through the CLI -------------------------------------------------------------


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """`autotune search` run once with 4 trials (the two references + two sampled)."""
    where = tmp_path_factory.mktemp("search")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(where)
        result = invoke("search", "--model", "gpt2-tiny", *FAST, "--n-trials", "4", "--space", TINY)
    return where, result


def test_search_writes_study_and_recipe(searched, monkeypatch):
    where, result = searched
    monkeypatch.chdir(where)
    assert result.exit_code == 0, result.output
    assert (where / "studies" / f"{STUDY}.db").is_file()
    assert (where / "recipes" / f"{STUDY}.json").is_file()
    out = result.stdout
    assert f"study {STUDY}: 4 trials (" in out
    assert "speedup vs baseline" in out and "speedup vs checklist" in out
    assert f"recipe: recipes/{STUDY}.json" in out

    study = load_study(STUDY, None)
    trials = study.trials
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert [t.user_attrs.get("reference") for t in trials] == ["baseline", "checklist", None, None]
    assert trials[0].user_attrs["config"] == baseline_config(128).to_dict()
    checklist, _ = checklist_config(128, prepare(settings())[0].capabilities)
    assert trials[1].user_attrs["config"] == checklist.to_dict()
    assert checklist.amp_dtype == "bfloat16" and checklist.compile_mode == "default" and not checklist.pin_memory
    assert any(n.startswith("pin_memory changed") for n in trials[1].user_attrs["reference_notes"])
    for t in trials:
        assert t.state == TrialState.COMPLETE and t.user_attrs["outcome"] == "ok", (t.number, t.user_attrs)
        assert t.constraints["memory"] <= 0
        assert t.value == t.user_attrs["tokens_per_sec"] > 0
        if "duplicate_of" not in t.user_attrs:  # a re-proposed configuration is not run again
            assert t.user_attrs["trial_pid"] and t.user_attrs["wall_s"] > 0 and "total" in t.user_attrs["phase_s"]
    for t in trials[2:]:  # sampled from the space
        cfg = t.user_attrs["config"]
        assert cfg["batching"] == "padded" and cfg["token_budget"] in (1024, 2048)
        assert cfg["sdpa_backend"] in ("math", "flash") and cfg["compile_mode"] == "none"

    attrs = study.user_attrs
    assert attrs["space_hash"] == load_space(TINY).hash
    assert attrs["identity"]["model"] == "gpt2-tiny" and attrs["seq_len"] == 128 and attrs["n_layer"] == 2
    assert attrs["run"] == {"warmup": 1, "steps": 4, "min_time_s": 2.0, "seed": 0}

    summary = summarize(study)
    best = summary.best
    assert best.value == max(t.value for t in trials)
    assert f"best: trial #{best.number}" in out
    recipe = Recipe.load(where / "recipes" / f"{STUDY}.json")
    assert recipe.config == TrainConfig.from_dict(best.user_attrs["config"])
    assert recipe.study["name"] == STUDY and recipe.study["trial"] == best.number
    # the winner's curse: the best was measured once more, and the recipe reports the mean
    confirmation = attrs[f"confirmation:{best.number}"]
    assert confirmation["outcome"] == "ok" and confirmation["tokens_per_sec"] > 0
    runs = [best.user_attrs["tokens_per_sec"], confirmation["tokens_per_sec"]]
    assert recipe.measured["tokens_per_sec_runs"] == pytest.approx(runs)
    assert recipe.measured["tokens_per_sec"] == pytest.approx(sum(runs) / 2)
    assert recipe.reference_speedups["baseline"] == pytest.approx(summary.speedup(summary.baseline))
    assert recipe.reference_speedups["checklist"] == pytest.approx(summary.speedup(summary.checklist))
    assert recipe.model["name"] == "gpt2-tiny"


def test_show_json_lists_trials_best_first(searched, monkeypatch):
    where, _ = searched
    monkeypatch.chdir(where)
    result = invoke("show", "--study", STUDY, "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    study = load_study(STUDY, None)
    best = summarize(study).best
    assert shown["study"] == STUDY and shown["model"] == "gpt2-tiny"
    assert shown["best"]["number"] == best.number
    assert shown["trials"][0]["number"] == best.number
    assert {t["number"] for t in shown["trials"]} == {t.number for t in study.trials}
    rates = [t["tokens_per_sec"] for t in shown["trials"] if t["outcome"] == "ok"]
    assert rates == sorted(rates, reverse=True)
    assert sum(shown["counts"].values()) == len(study.trials)
    assert shown["speedup_vs_baseline"] > 0 and shown["speedup_vs_checklist"] > 0

    text = invoke("show", "--study", STUDY)
    assert text.exit_code == 0 and f"study {STUDY}: model gpt2-tiny" in text.stdout
    assert "speedup vs baseline" in text.stdout


def test_export_study_writes_the_best_recipe(searched, monkeypatch):
    where, _ = searched
    monkeypatch.chdir(where)
    result = invoke("export", "--study", STUDY, "-o", "out.json")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "wrote out.json"
    best = summarize(load_study(STUDY, None)).best
    exported = Recipe.load(where / "out.json")
    assert exported.config == TrainConfig.from_dict(best.user_attrs["config"])
    assert exported.config == Recipe.load(where / "recipes" / f"{STUDY}.json").config
    assert exported.study["trial"] == best.number


def test_resume_with_another_space_is_refused(searched, monkeypatch):
    where, _ = searched
    monkeypatch.chdir(where)
    before = len(load_study(STUDY, None).trials)
    other = str(SPACES / "unsupported.yaml")
    result = invoke("search", "--model", "gpt2-tiny", *FAST, "--n-trials", "1", "--space", other)
    assert result.exit_code == 2
    old, new = load_space(TINY).hash, load_space(other).hash
    assert result.stderr == (f"Error: study '{STUDY}' was made for search space (hash) {old}, this run is search "
                             f"space (hash) {new}: resume it with the same settings, or choose a new name with --study\n")
    assert len(load_study(STUDY, None).trials) == before


def test_search_again_adds_trials_to_the_study(searched, monkeypatch):
    where, _ = searched
    monkeypatch.chdir(where)
    result = invoke("search", "--model", "gpt2-tiny", *FAST, "--n-trials", "2", "--space", TINY, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["study"] == STUDY and summary["n_trials"] == 6
    assert sum(summary["counts"].values()) == 6
    assert summary["best"]["outcome"] == "ok" and summary["best"]["tokens_per_sec"] > 0
    assert summary["speedup_vs_baseline"] > 0 and summary["speedup_vs_checklist"] > 0
    assert summary["baseline"]["number"] == 0 and summary["checklist"]["number"] == 1
    assert summary["recipe"] == f"recipes/{STUDY}.json"
    trials = load_study(STUDY, None).trials
    assert [t.number for t in trials] == list(range(6))
    assert [t.number for t in trials if t.user_attrs.get("reference")] == [0, 1]  # not enqueued again
    recipe = Recipe.load(where / summary["recipe"])
    assert recipe.config.to_dict() == summary["best"]["config"]


# --- outcomes, with models that fail on purpose ----------------------------------------------------


def test_segfault_is_crashed_and_the_search_goes_on(workdir):
    result = invoke("search", "--model", "tests.fault_models:segfault", *FAST, "--n-trials", "2", "--space", TINY)
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "Error: no trial finished a measurement; no recipe written"
    trials = load_study("segfault-cpu", None).trials
    assert len(trials) == 2  # the second trial ran after the first crashed
    for t in trials:
        assert t.state == TrialState.FAIL
        assert t.user_attrs["outcome"] == "crashed"
        reason = t.user_attrs["reason"]
        assert reason.startswith("killed by SIGSEGV"), reason
        assert "fault_models: about to segfault" in reason  # the stderr tail
    assert "#0   crashed" in result.stdout and "killed by SIGSEGV" in result.stdout
    assert not (workdir / "recipes").exists()


def _group_alive(pgid: int) -> list[int]:
    """Processes of process group `pgid` that still run (zombies are dead, just not reaped)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, _, pg = stat.rsplit(")", 1)[1].split()[:3]
        if int(pg) == pgid and state != "Z":
            alive.append(int(entry))
    return alive


def test_hang_is_timeout_and_the_whole_group_is_killed(workdir, monkeypatch):
    pidfile = workdir / "child.pid"
    monkeypatch.setenv("AUTOTUNE_TEST_PIDFILE", str(pidfile))
    # 15 s: time for the process start and set-up on a loaded CPU (~10 s at load 10 on 2 cores),
    # so forward() surely starts its child before the kill.
    result = invoke("search", "--model", "tests.fault_models:hang", *FAST, "--n-trials", "1", "--space", TINY,
                    "--trial-timeout", "15s")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "Error: no trial finished a measurement; no recipe written"
    (trial,) = [t for t in load_study("hang-cpu", None).trials if t.state != TrialState.WAITING]
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["outcome"] == "timeout"
    assert trial.user_attrs["reason"] == "no result after 15 s; the process group was killed"
    child = int(pidfile.read_text())  # forward() ran and started its "DataLoader worker"
    deadline = time.monotonic() + 5
    while _group_alive(trial.user_attrs["trial_pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group_alive(trial.user_attrs["trial_pid"]) == []
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # gone, or a zombie


def test_unsupported_is_pruned_before_any_process(workdir):
    ctx, _, _ = prepare(settings(space=str(SPACES / "unsupported.yaml")))
    efficient, rule = run_objective(ctx, [{"token_budget": 1024, "sdpa_backend": "efficient"},
                                          {"token_budget": 1024, "sdpa_backend": "math"}]).trials
    for t in (efficient, rule):
        assert t.state == TrialState.PRUNED
        assert t.user_attrs["outcome"] == "unsupported"
        for attr in ("trial_pid", "phase_s", "wall_s", "measurement", "tokens_per_sec"):
            assert attr not in t.user_attrs  # no process was started
    assert efficient.user_attrs["reason"] == "sdpa_backend: efficient attention is a CUDA kernel; on CPU use math or flash"
    assert rule.user_attrs["reason"] == "this test space runs math attention only with 2048-token batches"
    assert nothing_written(workdir)


# memory_hog's peak RSS on this CPU (autotune bench --json, 4 steps): ~380 MiB at 1024 tokens,
# ~1.3 GiB at 16384. The limit sits between them, and the large one stays under the runner's
# 1.5x watchdog, so it is measured to the end and recorded over the limit.
HOG_LIMIT = 1100 * 2**20


def test_over_memory_limit_is_infeasible_and_never_best(workdir):
    ctx, _, _ = prepare(settings(model="tests.fault_models:memory_hog", space=str(SPACES / "memory.yaml"),
                                 memory_limit_bytes=HOG_LIMIT))
    study = run_objective(ctx, [{"token_budget": 1024}, {"token_budget": 16384}])
    small, large = study.trials
    assert small.state == TrialState.COMPLETE and small.user_attrs["outcome"] == "ok", small.user_attrs
    assert small.user_attrs["peak_memory_bytes"] < HOG_LIMIT
    assert small.constraints["memory"] < 0 and is_feasible_ok(small)
    assert large.state == TrialState.COMPLETE and large.user_attrs["outcome"] == "over_memory_limit", large.user_attrs
    peak = large.user_attrs["peak_memory_bytes"]
    assert HOG_LIMIT < peak < 1.5 * HOG_LIMIT
    assert large.constraints["memory"] == pytest.approx((peak - HOG_LIMIT) / HOG_LIMIT) and large.constraints["memory"] > 0
    assert large.user_attrs["reason"] == (f"peak memory {outcomes.format_bytes(peak)} is above the limit "
                                          f"{outcomes.format_bytes(HOG_LIMIT)}")
    assert large.value == large.user_attrs["tokens_per_sec"] > 0  # measured: TPE learns from it
    assert not is_feasible_ok(large)
    summary = summarize(study)
    assert summary.best.number == small.number
    assert summary.counts == {"ok": 1, "over_memory_limit": 1}


def test_raises_is_crashed_with_the_exception(workdir):
    result = run_search(settings(model="tests.fault_models:raises", n_trials=1))
    assert result.summary.best is None and result.recipe_path is None
    assert result.summary.counts == {"crashed": 1, "waiting": 1}
    trial = result.study.trials[0]
    assert trial.state == TrialState.FAIL and trial.user_attrs["reference"] == "baseline"
    reason = trial.user_attrs["reason"]
    assert reason.startswith("ValueError: boom\n"), reason
    assert "fault_models.py" in reason  # the traceback's tail
    assert trial.user_attrs["trial_pid"] and trial.user_attrs["wall_s"] > 0
    assert not (workdir / "recipes").exists()


def test_no_feasible_trial(workdir):
    # 1 MiB: the runner's RSS watchdog stops the trial at once; it is infeasible, not a crash.
    result = invoke("search", "--model", "gpt2-tiny", *FAST, "--n-trials", "1", "--space", TINY,
                    "--memory-limit", "1MiB")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "Error: no trial fits the memory limit; no recipe written"
    assert "no trial fits the memory limit" in result.stdout
    (trial,) = [t for t in load_study(STUDY, None).trials if t.state != TrialState.WAITING]
    assert trial.state == TrialState.COMPLETE and trial.value == 0.0
    assert trial.user_attrs["outcome"] == "over_memory_limit"
    assert trial.user_attrs["reason"].endswith("passed 1.5x the limit 1.00 MiB; stopped early")
    assert trial.constraints == {"memory": 1.0}
    assert not (workdir / "recipes").exists()


# --- how the objective records each outcome (no process: run_trial is replaced) ----------------------


MEASUREMENT = Measurement(config={}, outcome="ok", tokens_per_sec=5000.0, peak_memory_bytes=800)


@pytest.mark.parametrize("result, state, value, constraint", [
    (TrialResult("ok", None, MEASUREMENT), TrialState.COMPLETE, 5000.0, -0.2),
    (TrialResult("over_memory_limit", "peak above", dataclasses.replace(MEASUREMENT, outcome="over_memory_limit", peak_memory_bytes=1500)),
     TrialState.COMPLETE, 5000.0, 0.5),
    (TrialResult("over_memory_limit", "stopped early"), TrialState.COMPLETE, 0.0, 1.0),  # RSS watchdog
    (TrialResult("oom", "out of memory: CUDA"), TrialState.COMPLETE, 0.0, 1.0),
    (TrialResult("unsupported", "sdpa_backend: no kernel"), TrialState.PRUNED, None, None),
    (TrialResult("crashed", "killed by SIGSEGV\ntail"), TrialState.FAIL, None, None),
    (TrialResult("timeout", "no result after 8 s"), TrialState.FAIL, None, None),
], ids=["ok", "over_limit", "over_limit_stopped", "oom", "unsupported", "crashed", "timeout"])
def test_objective_records_outcome(workdir, monkeypatch, result, state, value, constraint):
    monkeypatch.setattr("autotune.search.objective.run_trial", lambda *a, **k: result)
    ctx, _, _ = prepare(settings(memory_limit_bytes=1000))
    (trial,) = run_objective(ctx, [TINY_PARAMS]).trials
    assert trial.state == state
    assert trial.user_attrs["outcome"] == result.outcome
    assert trial.user_attrs.get("reason") == result.reason
    assert trial.value == value
    assert (trial.constraints["memory"] if trial.constraints else None) == (pytest.approx(constraint) if constraint is not None else None)
    assert trial.user_attrs["config"] == TrainConfig(batching="padded", token_budget=1024, amp_dtype="float32",
                                                     compile_mode="none", sdpa_backend="math").to_dict()


def test_objective_reuses_a_repeated_configuration(workdir, monkeypatch):
    calls = []

    def fake_run_trial(spec, cfg, **kwargs):
        calls.append(cfg)
        return TrialResult("ok", None, MEASUREMENT)

    monkeypatch.setattr("autotune.search.objective.run_trial", fake_run_trial)
    ctx, _, _ = prepare(settings(memory_limit_bytes=1000))
    first, again = run_objective(ctx, [TINY_PARAMS, TINY_PARAMS]).trials
    assert len(calls) == 1
    assert again.user_attrs["duplicate_of"] == first.number
    assert again.value == first.value and again.state == TrialState.COMPLETE


def test_ctrl_c_records_the_trial_and_keeps_the_best_so_far(workdir, monkeypatch):
    def fake_run_trial(spec, cfg, **kwargs):
        if cfg.batching == "fixed":  # the baseline reference: measured
            return TrialResult("ok", None, MEASUREMENT)
        raise KeyboardInterrupt

    monkeypatch.setattr("autotune.search.objective.run_trial", fake_run_trial)
    with pytest.raises(SearchInterrupted) as info:
        run_search(settings(n_trials=4))
    assert info.value.exit_code == 130
    trials = info.value.result.study.trials
    assert trials[0].state == TrialState.COMPLETE
    assert trials[1].state == TrialState.FAIL and trials[1].user_attrs["outcome"] == "interrupted"
    assert info.value.result.recipe_path == Path("recipes") / f"{STUDY}.json"
    assert Recipe.load(info.value.result.recipe_path).config == baseline_config(128)


# --- the outcome rules ------------------------------------------------------------------------------


def test_classify_exit():
    assert outcomes.classify_exit(-signal.SIGSEGV, "Fatal Python error") == (
        "crashed", "killed by SIGSEGV\nFatal Python error")
    assert outcomes.classify_exit(-signal.SIGKILL, "") == (
        "oom", "killed by SIGKILL (most likely the kernel's out-of-memory killer)")
    assert outcomes.classify_exit(-signal.SIGABRT, "") == ("crashed", "killed by SIGABRT")
    assert outcomes.classify_exit(1, "Traceback ...\nImportError: x") == (
        "crashed", "exited with status 1\nTraceback ...\nImportError: x")


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 (a traceback, as measure() sees it)
        return caught


def test_classify_exception():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    assert outcomes.classify_exception(oom) == ("oom", "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert outcomes.classify_exception(MemoryError())[0] == "oom"
    assert outcomes.classify_exception(RuntimeError("DefaultCPUAllocator: not enough memory: out of memory"))[0] == "oom"
    assert outcomes.classify_exception(UnsupportedConfig("amp_dtype", "tf32 is CUDA only")) == (
        "unsupported", "amp_dtype: tf32 is CUDA only")
    assert outcomes.classify_exception(RuntimeError("No available kernel. Aborting execution.")) == (
        "unsupported", "sdpa_backend: the forced attention backend cannot run these inputs "
                       "(No available kernel. Aborting execution.)")
    outcome, reason = outcomes.classify_exception(_raised(ValueError("boom")))
    assert outcome == "crashed" and reason.startswith("ValueError: boom\nTraceback") and "test_search.py" in reason
    assert outcomes.classify_exception(RuntimeError("shape mismatch"))[0] == "crashed"


def test_classify_the_real_sdpa_error():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(RuntimeError) as info, sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)  # no efficient kernel on CPU
    outcome, reason = outcomes.classify_exception(info.value)
    assert outcome == "unsupported"
    assert reason.startswith("sdpa_backend: the forced attention backend cannot run these inputs (")


def test_decide_measured():
    assert outcomes.decide_measured(900, 1000) == ("ok", None)
    assert outcomes.decide_measured(1000, 1000) == ("ok", None)  # at the limit fits
    assert outcomes.decide_measured(3 * 2**30, None) == ("ok", None)
    assert outcomes.decide_measured(None, 1000) == ("ok", None)
    assert outcomes.decide_measured(3 * 2**30, 2 * 2**30) == (
        "over_memory_limit", "peak memory 3.00 GiB is above the limit 2.00 GiB")
    assert outcomes.decide_measured(1001, 1000) == ("over_memory_limit", "peak memory 1001 B is above the limit 1000 B")


# --- the CLI's errors ---------------------------------------------------------------------------------


BAD_INPUT = [
    (["--memory-limit", "-5GiB"], "Error: --memory-limit: the memory size must be positive, got '-5GiB'"),
    (["--memory-limit", "lots"],
     "Error: --memory-limit: cannot read 'lots' as a memory size; expected e.g. 60GiB, 512MiB or 8000000000"),
    (["--model", "nope"],
     "Error: unknown model 'nope': expected one of gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny or package.module:factory"),
    (["--model", "tests.fault_models:missing"], "Error: model 'tests.fault_models:missing': tests.fault_models has no callable 'missing'"),
    (["--space", str(SPACES / "malformed.yaml")],
     f"Error: search space {SPACES / 'malformed.yaml'}: malformed YAML at line 4 (expected ',' or '}}', but got '<scalar>')"),
    (["--space", str(SPACES / "unknown_key.yaml")],
     f"Error: search space {SPACES / 'unknown_key.yaml'}: dimensions.sdpa_backend.choice: unknown key; "
     "expected choices, high, log, low, step, when"),
    (["--space", "nowhere.yaml"], "Error: search space nowhere.yaml: cannot read it (No such file or directory)"),
    (["--n-trials", "0"], "Error: Invalid value for --n-trials: must be at least 1"),
    (["--timeout", "10x"], "Error: --timeout: cannot read '10x' as a duration; expected e.g. 90s, 10m or 2h"),
    (["--trial-timeout", "0s"], "Error: --trial-timeout: the duration must be positive, got '0s'"),
    (["--memory-fraction", "2"], "Error: --memory-fraction must be in (0, 1], got 2.0"),
]


@pytest.mark.parametrize("args, message", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_search_bad_input(workdir, args, message):
    result = invoke("search", *FAST, "--space", TINY, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == message
    assert result.stdout == ""
    assert nothing_written(workdir)


def test_storage_password_never_shown(workdir):
    url = "postgresql://tuner:s3cret@127.0.0.1:1/db"
    result = invoke("search", "--model", "gpt2-tiny", *FAST, "--space", TINY, "--storage", url)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: storage postgresql://tuner:***@127.0.0.1:1/db: cannot open it (")
    assert "s3cret" not in result.output
    assert nothing_written(workdir)
    shown = invoke("show", "--storage", url)
    assert shown.exit_code == 2 and "s3cret" not in shown.output and "tuner:***@" in shown.stderr


def test_show_and_export_errors(workdir):
    result = invoke("show", "--study", "nope")
    assert result.exit_code == 2
    assert result.stderr == "Error: storage sqlite:///studies/nope.db: no such database file\n"
    result = invoke("export")
    assert result.exit_code == 2
    assert result.stderr == "Error: give either a RECIPE file or --study (with --storage when not the default)\n"
    assert nothing_written(workdir)


# --- the recipe file --------------------------------------------------------------------------------


def test_recipe_round_trip(tmp_path):
    recipe = Recipe(
        config=TrainConfig(num_workers=2, prefetch_factor=4, persistent_workers=True, token_budget=4096,
                           batching="packed", amp_dtype="bfloat16", sdpa_backend="flash", checkpoint_layers=(0, 2)),
        model={"name": "gpt2-tiny", "seq_len": 128, "n_layer": 2},
        measured={"tokens_per_sec": 1234.5, "peak_memory_bytes": 10**9, "memory_limit_bytes": 2 * 10**9},
        reference_speedups={"baseline": 2.5, "checklist": None},
        hardware={"name": "cpu", "kind": "cpu"},
        software={"torch": torch.__version__},
        study={"name": "s", "storage": "sqlite:///studies/s.db", "trial": 3},
        created="2026-01-01T00:00:00+00:00",
    )
    path = recipe.save(tmp_path / "r.json")
    loaded = Recipe.load(path, check_environment=False)
    assert loaded.to_dict() == recipe.to_dict()
    assert loaded.config == recipe.config and loaded.config.checkpoint_layers == (0, 2)
    assert json.loads(path.read_text())["format"] == "autotune.recipe"


def test_a_reference_stopped_early_has_no_rate_and_is_not_a_reference_figure():
    """A reference trial the RSS watchdog stopped (over_memory_limit, no tokens/s) cannot
    anchor a speedup; the summary then has no such reference rather than a None rate."""
    import optuna

    from autotune.search.study import summarize

    study = optuna.create_study(direction="maximize")
    for reference, attrs in (("baseline", {"outcome": "ok", "tokens_per_sec": 100.0}),
                             ("checklist", {"outcome": "over_memory_limit"})):
        study.add_trial(optuna.trial.create_trial(value=attrs.get("tokens_per_sec", 0.0),
                                                  user_attrs={"reference": reference, **attrs}))
    summary = summarize(study)
    assert summary.baseline is not None and summary.checklist is None
