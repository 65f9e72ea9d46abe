"""From a study's best trial to a recipe: its measurement (with the confirmation run's
figure, when there is one) and where it came from. Reads a study only: no torch."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune import registry
from autotune.config import config_class
from autotune.device.info import software_versions
from autotune.errors import UsageError
from autotune.recipe.recipe import Recipe, now_iso, recipe_measured
from autotune.study.record import TrialRecord
from autotune.study.summary import StudySummary, summarize
from autotune.study.urls import redact


def recipe_from_trial(
    summary: StudySummary, study_name: str, storage_url: str, trial: TrialRecord | None = None
) -> Recipe:
    trial = trial or summary.best
    m, about = trial.measurement, summary.about
    measured = recipe_measured(m, about.memory_limit_bytes, about.memory_headroom)
    measured["objective"] = about.objective
    confirmation = trial.confirmation
    if trial.confirmed and m is not None:
        runs = list(trial.runs)
        measured["tokens_per_sec"] = trial.figure
        measured["tokens_per_sec_runs"] = runs  # the trial, then its re-measurement
        # The interval of the mean (None where the two runs disagree beyond their own intervals)
        measured["tokens_per_sec_ci95"] = trial.figure_ci95
        energies = [e for e in (m.joules_per_token, confirmation.joules_per_token) if e is not None]
        if len(energies) == 2:
            measured["joules_per_token"] = sum(energies) / 2
    task = about.task
    if task == registry.GENERATE and m is not None:
        measured["generation"] = m.generation  # time to first token, per-token latency, the check
    if m is not None and m.world_size > 1:  # several ranks: tokens_per_sec is global (the mean of its runs)
        measured["per_device_tokens_per_sec"] = measured["tokens_per_sec"] / m.world_size
        measured["scaling_efficiency"] = summary.scaling_efficiency  # against N x the best on one rank
    leaders = [c for c in summary.leaders if c.remeasured]
    if len(leaders) > 1:  # the winner was chosen among several: say among which, and by what
        measured["leaders"] = [{"trial": c.number, "runs": list(c.values), "mean": c.mean} for c in leaders]
    return Recipe(
        config=config_class(task).from_dict(trial.config),
        model={**(m.model if m else {}), "name": about.model},
        data=about.data or "synthetic",
        measured=measured,
        reference_speedups={
            "baseline": summary.speedup(summary.baseline),
            "checklist": summary.speedup(summary.checklist),
        },
        reference_flags={
            name: flags
            for name, reference in (("baseline", summary.baseline), ("checklist", summary.checklist))
            if (flags := summary.speedup_flags(reference))
        },
        hardware=about.hardware,
        software=about.software or software_versions(),
        study={"name": study_name, "storage": redact(storage_url), "trial": trial.number},
        created=now_iso(),
        # The study's global batch: every trial reached it by accumulating token_budget micro-batches.
        global_batch_tokens=about.run.global_batch_tokens,
        world_size=about.run.nproc_per_node,  # the ranks every trial ran on
        task=task,
        workload=dict(about.workload or {}),
    )


def write_recipe(study: optuna.Study, summary: StudySummary, name: str, url: str, path: str | None) -> Path:
    recipe = recipe_from_trial(summary, name, url)
    return recipe.save(path or Path("recipes") / f"{name}.json")


def best_recipe(study: optuna.Study, storage_url: str) -> Recipe:
    """The recipe of a stored study's best trial (`export --study`); UsageError when no trial
    fits its memory limit."""
    summary = summarize(study)
    if summary.best is None:
        raise UsageError(f"study {study.study_name!r} has no best trial ({summary.no_best_reason}): nothing to export")
    return recipe_from_trial(summary, study.study_name, storage_url)
