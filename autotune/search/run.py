"""`autotune search` as a library call: settings in, a study and the best recipe out.

Printing belongs to the caller: progress goes through a `Reporter` (the CLI's draws a bar)."""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import RunSpec, TrainConfig
from autotune.device import DeviceInfo, describe, resolve_device, total_host_memory
from autotune.errors import AutotuneError, UsageError
from autotune.search.best import confirmation_key, write_recipe
from autotune.search.objective import Objective, TrialFailed
from autotune.search.space_file import default_space_path, load_space
from autotune.search.storage import default_grace_period_s, default_storage_url, is_sqlite, open_storage, redact
from autotune.search.study import StudyContext, StudySummary, fail_orphaned_trials, open_study, summarize
from autotune.trial._proc import process_alive
from autotune.trial.runner import run_trial

log = logging.getLogger(__name__)

DEFAULT_MEMORY_FRACTION = 0.9


@dataclass(frozen=True)
class SearchSettings:
    model: str = "gpt2"
    device: str = "auto"
    data: str = "synthetic"
    seq_len: int | None = None
    study: str | None = None
    storage: str | None = None
    space: str | None = None
    memory_limit_bytes: int | None = None
    memory_fraction: float | None = None
    n_trials: int = 20
    timeout_s: float | None = None  # the whole search
    trial_timeout_s: float | None = None  # one trial (default: 300 s on CPU, 600 s on CUDA)
    warmup: int = 3
    steps: int = 20
    min_time_s: float = 2.0
    seed: int = 0
    recipe: str | None = None
    warm_start_from: str | None = None


class Reporter(Protocol):
    def trial_started(self, number: int, cfg: TrainConfig) -> None: ...
    def trial_finished(self, trial: FrozenTrial, summary: StudySummary) -> None: ...
    def confirming(self, number: int) -> None: ...


@dataclass
class SearchResult:
    study: optuna.Study
    summary: StudySummary
    context: StudyContext
    storage_url: str
    recipe_path: Path | None
    new_study: bool
    worker_failures: list[str] = field(default_factory=list)  # --devices: workers that did not end well


def model_slug(model: str) -> str:
    """The model part of a default study name: `gpt2`, `hf-gpt2`, `hf-<directory name>` for a
    local config directory, `pkg.mod-factory` for a factory (with its module, so that two
    modules' `factory` functions do not share a study)."""
    if model.startswith("hf:"):
        spec = model[len("hf:") :]
        name = "hf-" + (Path(spec).name or spec if ("/" in spec or spec.startswith(".")) else spec)
    else:
        name = model.replace(":", "-")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


def memory_limit(settings: SearchSettings, device: DeviceInfo) -> int:
    """--memory-limit, else --memory-fraction (default 0.9) of the device total: NVML's
    total on a GPU, the host's RAM on CPU (where the limit applies to peak RSS)."""
    if settings.memory_limit_bytes is not None:
        return settings.memory_limit_bytes
    fraction = settings.memory_fraction if settings.memory_fraction is not None else DEFAULT_MEMORY_FRACTION
    if not 0 < fraction <= 1:
        raise UsageError(f"--memory-fraction must be in (0, 1], got {fraction}")
    total = device.total_memory_bytes if device.kind == "cuda" else total_host_memory()
    if not total:
        raise UsageError("the device's total memory is unknown (no NVML): give --memory-limit")
    return int(fraction * total)


def prepare(settings: SearchSettings) -> tuple[StudyContext, str, str]:
    """Validate everything before anything is written: (context, study name, storage URL)."""
    from autotune.model.gpt import MODEL_SIZES  # the tuner needs a model's shape, hence torch
    from autotune.model.introspect import model_shape
    from autotune.model.load import build_model, check_model_name

    check_model_name(settings.model)
    device_name = resolve_device(settings.device)
    device = describe(device_name)
    if settings.model in MODEL_SIZES:
        cfg = MODEL_SIZES[settings.model]
        seq_len, n_layer = settings.seq_len or cfg.block_size, cfg.n_layer
    else:
        shape = model_shape(build_model(settings.model), settings.seq_len)
        seq_len, n_layer = shape.context_length, shape.n_layer
    space_path = settings.space or default_space_path(device.kind)
    space = load_space(space_path, n_layer=n_layer, seq_len=seq_len)
    spec = RunSpec(
        model=settings.model,
        device=device_name,
        data=settings.data,
        seq_len=settings.seq_len,
        warmup=settings.warmup,
        steps=settings.steps,
        min_time_s=settings.min_time_s,
        seed=settings.seed,
        memory_limit_bytes=memory_limit(settings, device),
    )
    timeout = settings.trial_timeout_s or (300.0 if device.kind == "cpu" else 600.0)
    ctx = StudyContext(
        spec=spec, device=device, space=space, memory_limit_bytes=spec.memory_limit_bytes, trial_timeout_s=timeout
    )
    name = settings.study or f"{model_slug(settings.model)}-{device.slug}"
    url = settings.storage or default_storage_url(name)
    return ctx, name, url


def run_search(settings: SearchSettings, reporter: Reporter | None = None) -> SearchResult:
    ctx, name, url = prepare(settings)
    storage = open_storage(url, grace_period_s=default_grace_period_s())
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our reporter says what happened
    study, is_new = open_study(name, storage, ctx, seed=settings.seed)
    orphans = fail_orphaned_trials(study)
    if orphans:
        log.warning("failed %d trial(s) left running by a killed tuner: %s", len(orphans), orphans)
    if is_sqlite(url):
        warn_if_sqlite_shared(study, url)
    if settings.warm_start_from and is_new:
        from autotune.search.warm_start import enqueue_warm_start

        enqueue_warm_start(study, settings.warm_start_from, ctx)

    objective = Objective(ctx, on_running=reporter.trial_started if reporter else None)

    def after_trial(study: optuna.Study, trial: FrozenTrial) -> None:
        if reporter:
            reporter.trial_finished(trial, summarize(study))

    interrupted = False
    try:
        study.optimize(
            objective,
            n_trials=settings.n_trials,
            timeout=settings.timeout_s,
            catch=(TrialFailed,),
            callbacks=[after_trial],
            gc_after_trial=False,
        )
        confirm_best(study, ctx, reporter)
    except KeyboardInterrupt:
        interrupted = True
    summary = summarize(study)
    recipe_path = None
    if summary.best is not None:
        recipe_path = write_recipe(study, summary, name, url, settings.recipe)
    result = SearchResult(study, summary, ctx, url, recipe_path, is_new)
    if interrupted:
        raise SearchInterrupted(result)
    return result


def confirm_best(study: optuna.Study, ctx: StudyContext, reporter: Reporter | None = None) -> None:
    """The best of many noisy trials is biased upward (the winner's curse): measure it once
    more, in a fresh process, before it becomes a recipe; the recipe reports the mean of
    both runs. Kept as a study attr, so a resumed study does not confirm the same trial twice."""
    best = summarize(study).best
    if best is None or confirmation_key(best.number) in study.user_attrs:
        return
    if reporter is not None:
        reporter.confirming(best.number)
    result = run_trial(
        ctx.spec, TrainConfig.from_dict(best.user_attrs["config"]), timeout_s=ctx.trial_timeout_s, device=ctx.device
    )
    study.set_user_attr(
        confirmation_key(best.number),
        {
            "outcome": result.outcome,
            "tokens_per_sec": result.tokens_per_sec,
            "peak_memory_bytes": result.peak_memory_bytes,
        },
    )


SQLITE_WORKERS_WARNING = (
    "SQLite is not for parallel workers (one writer at a time: they fail with 'database is "
    "locked'): use --storage journal:PATH on one host, or PostgreSQL across hosts"
)


def warn_if_sqlite_shared(study: optuna.Study, url: str) -> bool:
    """Warn when another live tuner on this host is running a trial of this SQLite study."""
    host, me = socket.gethostname(), os.getpid()
    others = sorted(
        {
            t.user_attrs.get("tuner_pid")
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.user_attrs.get("host") == host
            and t.user_attrs.get("tuner_pid") not in (None, me)
            and process_alive(t.user_attrs["tuner_pid"])
        }
    )
    if others:
        log.warning(
            "another tuner (pid %s) is working on study %r in %s. %s",
            ", ".join(map(str, others)),
            study.study_name,
            redact(url),
            SQLITE_WORKERS_WARNING,
        )
    return bool(others)


class SearchInterrupted(AutotuneError):
    """Ctrl-C: the running trial was killed and recorded; the best so far was written."""

    exit_code = 130

    def __init__(self, result: SearchResult) -> None:
        super().__init__(
            "interrupted: the running trial was stopped and recorded"
            + (f"; the best so far is in {result.recipe_path}" if result.recipe_path else "")
        )
        self.result = result
