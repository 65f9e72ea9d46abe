"""Helpers for the tests of issue 14 (attacks from outside): searches whose trials are faked
(no process: `run_trial` is replaced), the CLI run in a folder that must stay untouched."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from click.testing import CliRunner

from autotune.cli import main
from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.search.run import SearchSettings
from autotune.trial.runner import TrialResult

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "tests" / "spaces" / "tiny.yaml")
FAST = ["--model", "gpt2-tiny", "--device", "cpu", "--space", TINY, "--steps", "4", "--warmup", "1", "--min-time", "0"]


def settings(**kwargs: Any) -> SearchSettings:
    base = dict(model="gpt2-tiny", device="cpu", space=TINY, steps=4, warmup=1, min_time_s=0)
    return SearchSettings(**{**base, **kwargs})


def measurement(
    cfg, *, tokens_per_sec: float = 1000.0, peak: int = 10**8, outcome: str = outcomes.OK, final_loss: float = 5.0
) -> Measurement:
    return Measurement(
        config=cfg.to_dict(),
        outcome=outcome,
        tokens_per_sec=tokens_per_sec,
        peak_memory_bytes=peak,
        peak_memory_source="rss",
        final_loss=final_loss,
        model={"name": "gpt2-tiny", "seq_len": 128, "n_layer": 2, "vocab_size": 320},
    )


def fake_trials(
    monkeypatch,
    *,
    delay_s: float = 0.0,
    peak: int = 10**8,
    calls: list | None = None,
    each: Callable[[Measurement, int], None] | None = None,
) -> None:
    """Every trial (and the re-measurements of the leaders) measures at once: ok, tokens/s from the token
    budget (so there is a best), the given peak memory. `each(measurement, index)`, when given, sees
    each run's measurement (index: 0 for the first run) before the tuner does: it may change it, or
    do something to the world at that moment (fill a disk, lock a database)."""
    runs: list[int] = []

    def run_trial(spec, cfg, **kwargs):
        if calls is not None:
            calls.append((spec, cfg))
        if delay_s:
            time.sleep(delay_s)
        m = measurement(cfg, tokens_per_sec=float(cfg.token_budget), peak=peak)
        if each is not None:
            each(m, len(runs))
        runs.append(1)
        outcome, reason = outcomes.decide_measured(peak, spec.memory_limit_bytes)
        m.outcome, m.reason = outcome, reason
        return TrialResult(outcome, reason, m, 0.1, {"total": 0.1})

    monkeypatch.setattr("autotune.search.training.run_trial", run_trial)
    monkeypatch.setattr("autotune.search.training.run_trial", run_trial)
    monkeypatch.setattr("autotune.search.scaling.run_trial", run_trial)  # a study of N ranks: the best on one


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def refused(tmp_path: Path, monkeypatch, *args: str, code: int = 2) -> str:
    """Run the CLI in tmp_path: it must refuse in one line with `code`, and write nothing."""
    monkeypatch.chdir(tmp_path)

    def no_trial(*args, **kwargs):
        raise AssertionError("a refused run must not run a trial")

    monkeypatch.setattr("autotune.search.training.run_trial", no_trial)
    monkeypatch.setattr("autotune.search.training.run_trial", no_trial)
    before = files_under(tmp_path)
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert files_under(tmp_path) == before, "a refused run must write nothing"
    return result.stderr


def repo_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess that must import the repository (and tests.*)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("AUTOTUNE_STORAGE", None)
    env.update(extra)
    return env


def in_repo_env(monkeypatch) -> None:
    """Trial and probe processes run in the test's tmp dir: let them import tests.*."""
    monkeypatch.setenv("PYTHONPATH", repo_env()["PYTHONPATH"])


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
