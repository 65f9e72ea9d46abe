"""`autotune search` as a library call: settings in, a study and the best recipe out.

Everything is checked before anything is written or run (`prepare`): the model (a user's
factory is built in a trial process, under the trial timeout: `trial.probe`), the data, the
space, the limits, the storage URL and its folder, the recipe's path and the disks they are
on, the warm-start source. A refused run creates nothing. A resumed study keeps its rules
(`study.check_rules`). SIGTERM and SIGHUP stop a search as Ctrl-C does (the CLI turns them
into `Stopped`): the running trial is recorded interrupted and the best so far is written.

Printing belongs to the caller: progress goes through a `Reporter` (the CLI's draws a bar)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import RunSpec, TrainConfig, check_int
from autotune.device import DeviceInfo, describe, resolve_device, total_host_memory, visible_gpu_count
from autotune.device.disk import check_writable
from autotune.errors import AutotuneError, DiskFull, UsageError
from autotune.measure import outcomes
from autotune.model.sizes import ModelDims
from autotune.recipe.from_study import write_recipe
from autotune.search.confirm import confirm_leaders
from autotune.search.objective import Objective, StudyNotWritable
from autotune.search.optimize import optimize
from autotune.search.references import enqueue_references, retry_interrupted_references
from autotune.search.salvage import Salvage
from autotune.search.sampler import PlannerSampler, study_sampler
from autotune.search.settings import SearchSettings
from autotune.search.stopping import SearchStop, budget_stop, interrupted_stop, no_room_stop, settled_stop
from autotune.space.file import default_space_path, load_space
from autotune.study.leaders import DEFAULT_OBJECTIVE, OBJECTIVES
from autotune.study.lifecycle import StudyContext, check_rules, fail_orphaned_trials, open_study, worker_seed
from autotune.study.record import TrialRecord
from autotune.study.storage import check_storage_writable, heartbeat_grace_s, open_storage, study_names
from autotune.study.summary import StudySummary, summarize
from autotune.study.urls import (
    STUDIES_DIR,
    check_study_name,
    default_storage_url,
    is_sqlite,
    parse_storage_url,
    redact,
)
from autotune.trial import folders
from autotune.trial.processes import exit_code_for, process_alive, stop_behind, stop_signal_of, stop_signals_raise
from autotune.units import MIN_MEMORY_SIZE, check_memory_fraction, format_bytes

log = logging.getLogger(__name__)

DEFAULT_MEMORY_FRACTION = 0.9
DEFAULT_TRIAL_TIMEOUT_S = {"cpu": 300.0, "cuda": 600.0}


class Reporter(Protocol):
    def trial_started(self, number: int, cfg: TrainConfig) -> None: ...
    def trial_finished(self, trial: TrialRecord, summary: StudySummary) -> None: ...
    def confirming(self, number: int, index: int, count: int) -> None: ...


@dataclass
class SearchResult:
    study: optuna.Study
    summary: StudySummary
    context: StudyContext
    storage_url: str
    recipe_path: Path | None
    new_study: bool
    worker_failures: list[str] = field(default_factory=list)  # --devices: workers that did not end well
    stopped: SearchStop | None = None  # why the search stopped
    stages: dict[str, int] = field(default_factory=dict)  # trials by what proposed them (stage_counts)


def model_slug(model: str) -> str:
    """The model part of a default study name: `gpt2`, `hf-gpt2`, `hf-<directory name>` for a
    local config directory, `pkg.mod-factory` for a factory (with its module, so that two
    modules' `factory` functions do not share a study)."""
    if model.startswith("hf:"):
        spec = model[len("hf:") :]
        name = "hf-" + (Path(spec).name or spec if ("/" in spec or spec.startswith(".")) else spec)
    else:
        name = model.replace(":", "-")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip(".-") or "model"


def default_study_name(model: str, device_slug: str, nproc_per_node: int = 1) -> str:
    """The study a search writes without --study: `gpt2-tiny-cpu`; `gpt2-tiny-cpu-2ranks` for a
    search of 2 ranks a trial, whose tokens/s is another figure than one rank's (a study of one
    rank keeps the name it always had, so it resumes)."""
    name = f"{model_slug(model)}-{device_slug}"
    return f"{name}-{nproc_per_node}ranks" if nproc_per_node > 1 else name


def memory_limit(settings: SearchSettings, device: DeviceInfo) -> int:
    """--memory-limit, else --memory-fraction (default 0.9) of the device total: NVML's
    total on a GPU, the host's RAM on CPU (where the limit applies to the run's process tree)."""
    if settings.memory_limit_bytes is not None:
        check_int("the memory limit", settings.memory_limit_bytes, minimum=1)
        return settings.memory_limit_bytes
    fraction = DEFAULT_MEMORY_FRACTION
    if settings.memory_fraction is not None:
        fraction = check_memory_fraction(settings.memory_fraction)
    total = device.total_memory_bytes if device.kind == "cuda" else total_host_memory()
    if not total:
        raise UsageError("the device's total memory is unknown (no NVML): give --memory-limit")
    limit = int(fraction * total)
    if limit < MIN_MEMORY_SIZE:
        raise UsageError(
            f"--memory-fraction {fraction:g} of {format_bytes(total)} is {format_bytes(limit)}; "
            "a memory limit must be at least 1 MiB"
        )
    return limit


MAX_MEMORY_HEADROOM = 0.5  # more would judge a configuration on under half the memory it may use


def memory_headroom(settings: SearchSettings) -> float:
    """--memory-headroom, else the default (see outcomes.DEFAULT_MEMORY_HEADROOM)."""
    headroom = settings.memory_headroom
    if headroom is None:
        return outcomes.DEFAULT_MEMORY_HEADROOM
    if not 0 <= headroom <= MAX_MEMORY_HEADROOM:
        raise UsageError(f"--memory-headroom must be from 0% to {MAX_MEMORY_HEADROOM:.0%}, got {headroom:g}")
    return headroom


# The options of one task only, by field, and what they are for.
GENERATION_ONLY = (
    "prompt_len",
    "prompts",
    "new_tokens",
    "batch",
    "max_p99_token_latency_s",
    "max_ttft_s",
    "agree_tokens",
    "fix",
)
# A generation search runs in one process: --nproc-per-node ran one and recorded no world size.
TRAINING_ONLY = ("data", "seq_len", "global_batch_tokens", "space", "warm_start_from", "nproc_per_node")


def check_task_options(settings: SearchSettings) -> None:
    """Refuse an option of the other task (one line): it would be silently ignored otherwise."""
    defaults = {name: default for name, _, default in SearchSettings.options()}
    flags = {name: option.flag for name, option, _ in SearchSettings.options()}
    other = TRAINING_ONLY if settings.task == "generate" else GENERATION_ONLY
    given = [name for name in other if getattr(settings, name) != defaults[name]]
    if given:
        needs = "--task train (the default)" if settings.task == "generate" else "--task generate"
        raise UsageError(f"{flags[given[0]]} is an option of {needs}")
    objectives = {"generate": ("tokens_per_sec", "latency"), "train": ("tokens_per_sec", "tokens_per_joule")}
    if settings.objective is not None and settings.objective not in objectives[settings.task]:
        raise UsageError(
            f"--objective {settings.objective} is not one of --task {settings.task}: "
            f"{' or '.join(objectives[settings.task])}"
        )


def prepare(settings: SearchSettings) -> tuple[StudyContext, str, str]:
    """Validate everything before anything is written: (context, study name, storage URL)."""
    from autotune.model.load import check_model_name
    from autotune.model.sizes import MODEL_SIZES  # without torch

    check_task_options(settings)
    if ":" not in settings.model:
        check_model_name(settings.model)  # a name of ours, or UsageError; imports nothing
    device_name = resolve_device(settings.device)
    device = describe(device_name)
    objective = _objective(settings.objective, device)
    timeout = _trial_timeout(settings, device.kind)
    limit = memory_limit(settings, device)
    if settings.seq_len is not None:
        check_int("--seq-len", settings.seq_len, minimum=2)
    if settings.model in MODEL_SIZES:
        cfg = MODEL_SIZES[settings.model]
        if settings.seq_len and settings.seq_len > cfg.block_size:
            raise UsageError(f"--seq-len {settings.seq_len} is longer than {settings.model}'s context {cfg.block_size}")
        seq_len, n_layer = settings.seq_len or cfg.block_size, cfg.n_layer
        dims = ModelDims(cfg.n_layer, cfg.n_embd, cfg.vocab_size)
    if settings.data != "synthetic":
        from autotune.data.datasets import check_data_spec

        check_data_spec(settings.data)  # at once; its content is read by the probe below
    if settings.model not in MODEL_SIZES or settings.data != "synthetic":
        # A user's factory, or a data file: built and read in a trial process, under the
        # trial timeout, so its failures are one line here and never a study locked to them.
        from autotune.trial.probe import probe

        probed = probe(
            settings.model,
            data=settings.data,
            seq_len=settings.seq_len,
            timeout_s=timeout,
            host_limit_bytes=limit if device.kind == "cpu" else None,
        )
        seq_len, n_layer = probed.context_length, probed.n_layer
        dims = ModelDims(probed.n_layer, probed.d_model, probed.vocab_size) if probed.d_model else None
    space_path = settings.space or default_space_path(device.kind, settings.nproc_per_node)
    space = load_space(space_path, n_layer=n_layer, seq_len=seq_len)
    _check_ranks(settings, space, device_name)
    spec = RunSpec(
        model=settings.model,
        device=device_name,
        data=settings.data,
        seq_len=settings.seq_len,
        warmup=settings.warmup,
        steps=settings.steps,
        min_time_s=_min_time(settings.min_time_s, objective, device),
        seed=settings.seed,
        memory_limit_bytes=limit,
        global_batch_tokens=settings.global_batch_tokens,
        nproc_per_node=settings.nproc_per_node,
    )
    _check_global_batch(space, spec.global_batch_tokens, spec.nproc_per_node)
    ctx = StudyContext(
        spec=spec,
        device=device,
        space=space,
        memory_limit_bytes=spec.memory_limit_bytes,
        trial_timeout_s=timeout,
        memory_headroom=memory_headroom(settings),
        objective=objective,
        model_dims=dims,
    )
    name, url = study_location(settings, default_study_name(settings.model, device.slug, settings.nproc_per_node))
    return ctx, name, url


def study_location(settings: SearchSettings, default_name: str) -> tuple[str, str]:
    """The study's name and storage URL, every place it writes checked writable (the storage,
    the recipe, the trials' temporary folders); a killed tuner's trial folders removed."""
    name = check_study_name(settings.study) if settings.study is not None else default_name
    if settings.storage:
        parse_storage_url(settings.storage)  # a malformed URL is refused before anything else
    if settings.new_study:
        name = next_free_study_name(name, settings.storage)
    url = settings.storage or default_storage_url(name)
    check_storage_writable(url)
    check_writable(recipe_path(settings, name), what="recipe", create_folders=True)
    # Each trial's request, result and stderr go to a temporary folder; a killed tuner's stay.
    check_writable(Path(tempfile.gettempdir()) / "autotune-trial-check", what="temporary folder for trials")
    for path in folders.remove_orphaned_folders():
        log.info("removed %s (a trial folder of a tuner that was killed)", path)
    return name, url


def _objective(objective: str | None, device: DeviceInfo) -> str:
    """The study's objective; tokens_per_joule only where this device has an energy counter."""
    if objective is None:
        return DEFAULT_OBJECTIVE
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective == "tokens_per_joule":
        from autotune.measure.energy import energy_meter

        meter = energy_meter(device.kind, device.uuid)
        if not meter.available:
            raise UsageError(
                f"--objective tokens_per_joule needs an energy counter, and {device.name} has none: {meter.note}"
            )
    return objective


def _min_time(min_time_s: float, objective: str, device: DeviceInfo) -> float:
    """The timed window's least seconds: under tokens_per_joule, at least what the energy
    counter resolves (5 s for NVML's; a shorter window has no energy figure)."""
    if objective != "tokens_per_joule":
        return min_time_s
    from autotune.measure.energy import energy_meter

    needed = energy_meter(device.kind, device.uuid).min_window_s
    if min_time_s < needed:
        log.info("--min-time %g s raised to %g s: the energy counter resolves no shorter window", min_time_s, needed)
    return max(min_time_s, needed)


def _check_global_batch(space, global_batch_tokens: int | None, ranks: int = 1) -> None:
    """Refuse a global batch that no token budget of the space (times the ranks: the global
    batch is across them) divides: every trial would be pruned. Budgets that do not divide it
    are pruned one by one (`RunSpec.accumulation_steps`)."""
    if global_batch_tokens is None:
        return
    budgets = _token_budgets(space)
    if budgets and not any(
        global_batch_tokens % (b * ranks) == 0 and b * ranks <= global_batch_tokens for b in budgets
    ):
        listed = ", ".join(map(str, budgets))
        ranks_said = f" times the {ranks} ranks" if ranks > 1 else ""
        raise UsageError(
            f"--global-batch-tokens {global_batch_tokens}: no token_budget of the space ({listed}){ranks_said} "
            "divides it; choose a multiple of one of them"
        )


def _check_ranks(settings: SearchSettings, space, device: str) -> None:
    """Several ranks: on CUDA they are cuda:0 ... cuda:N-1 (one device named is refused), and the
    space must say how they share the model (a trial of parallelism=none is refused by its rule)."""
    ranks = settings.nproc_per_node
    if ranks == 1:
        return
    if ":" in settings.device.strip():  # the user's; `device` is resolved, always with its index
        raise UsageError(
            f"--nproc-per-node {ranks} runs ranks on cuda:0 ... cuda:{ranks - 1}: give --device cuda, and choose the "
            "GPUs with CUDA_VISIBLE_DEVICES"
        )
    if device.startswith("cuda") and ranks > (visible := visible_gpu_count()):
        # Each rank takes a GPU of its own: every trial would crash at its first rank past the last.
        raise UsageError(
            f"--nproc-per-node {ranks} runs a rank per GPU, and this process sees {visible}: give at most "
            f"--nproc-per-node {visible}, or make more GPUs visible (CUDA_VISIBLE_DEVICES)"
        )
    fixed = space.fixed.get("parallelism")
    searched = space.dimensions.get("parallelism")
    if (fixed in (None, "none")) and (searched is None or not set(searched.choices or ()) - {"none"}):
        raise UsageError(
            f"--nproc-per-node {ranks}: the space {space.source} neither searches nor fixes parallelism (ddp, fsdp2), "
            "so every trial would be refused; use search_spaces/gpt2_ddp.yaml (cpu_ddp.yaml on CPU) or add it"
        )


def _token_budgets(space) -> list[int]:
    """The token budgets a space can give a trial, where it lists them (fixed, or choices); an
    integer range is left to the trials."""
    if "token_budget" in space.fixed:
        return [space.fixed["token_budget"]]
    dimension = space.dimensions.get("token_budget")
    if dimension is not None and dimension.choices:
        return list(dimension.choices)
    if dimension is None:
        from autotune.config import TrainConfig

        return [TrainConfig().token_budget]
    return []


def _trial_timeout(settings: SearchSettings, kind: str) -> float:
    timeout = settings.trial_timeout_s
    if timeout is None:
        return DEFAULT_TRIAL_TIMEOUT_S["cpu" if kind == "cpu" else "cuda"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise UsageError(f"--trial-timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def recipe_path(settings: SearchSettings, name: str) -> Path:
    return Path(settings.recipe) if settings.recipe else Path("recipes") / f"{name}.json"


def next_free_study_name(name: str, storage: str | None) -> str:
    """`name`, or NAME-2, NAME-3, ... : the first that names no study yet (in `storage`, or,
    with the default storage, no studies/NAME.db file). Reads only."""
    taken: set[str] = set()
    if storage is not None:
        parsed = parse_storage_url(storage)
        if parsed.path is None or parsed.path.exists():
            if not parsed.in_memory:
                taken = set(study_names(open_storage(storage, create=False)))
    for n in range(1, 10_000):
        candidate = name if n == 1 else f"{name}-{n}"
        exists = candidate in taken if storage is not None else (STUDIES_DIR / f"{candidate}.db").exists()
        if not exists:
            if candidate != name:
                log.warning("starting a new study, %s (%s exists)", candidate, name)
            return candidate
    raise UsageError(f"--new-study: no free name {name}-N left")


@dataclass
class OpenedStudy:
    study: optuna.Study
    is_new: bool
    ctx: StudyContext
    name: str
    url: str


def open_search(settings: SearchSettings) -> OpenedStudy:
    """Check everything, then open or resume the study: what `search` and the `--devices`
    parent share. A refused run has created nothing."""
    ctx, name, url = prepare(settings)
    warm = None
    if settings.warm_start_from:
        from autotune.search.warm_start import plan_warm_start

        warm = plan_warm_start(settings.warm_start_from, ctx)  # reads the source; refusals leave nothing
    storage = open_storage(url, grace_period_s=heartbeat_grace_s(url))
    if parse_storage_url(url).in_memory:
        log.warning("storage %s is in memory: the study is gone when this search ends (the recipe is written)", url)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our reporter says what happened

    def on_create(study: optuna.Study) -> None:
        # Once per study, by the process that creates it: never again on resume, nor by the
        # other workers of --devices. The references first (the yardsticks), then a warm start:
        # measured evidence from a study like this one, before the planner's own proposals.
        if settings.references:
            enqueue_references(study)
        if warm is not None:
            warm.enqueue(study)

    study, is_new = open_study(
        name,
        storage,
        ctx,
        sampler=lambda seed: study_sampler(ctx, seed),
        seed=settings.seed,
        on_create=on_create,
    )
    if not is_new:
        ctx = check_rules(
            study,
            ctx,
            limit_given=settings.limit_given,
            headroom_given=settings.memory_headroom is not None,
            objective_given=settings.objective is not None,
        )
        if warm is not None:
            log.warning(
                "study %r exists: --warm-start-from applies to a new study only and is ignored (start one with "
                "--new-study)",
                name,
            )
        study.sampler = study_sampler(ctx, worker_seed(settings.seed, len(study.trials)))  # its own limit, headroom
    orphans = fail_orphaned_trials(study)
    if orphans:
        log.warning("failed %d trial(s) left running by a killed tuner: %s", len(orphans), orphans)
    if not is_new and (retried := retry_interrupted_references(study)):
        log.warning("running the interrupted reference trial(s) again: %s", ", ".join(retried))
    return OpenedStudy(study, is_new, ctx, name, url)


def run_search(settings: SearchSettings, reporter: Reporter | None = None) -> SearchResult:
    """Run or resume the study (see the module's docstring). The first stop signal stops it in
    order; the ones after it are absorbed until the trial is recorded and the recipe written
    (`stop_signals_raise`)."""
    with stop_signals_raise():
        return _run_search(settings, reporter)


def _run_search(settings: SearchSettings, reporter: Reporter | None) -> SearchResult:
    opened = open_search(settings)
    on_running = reporter.trial_started if reporter else None
    objective = Objective(opened.ctx, on_running=on_running, memory_model=settings.memory_model)
    return search_study(opened, objective, settings, reporter)


def search_study(
    opened: OpenedStudy, objective: Objective, settings: SearchSettings, reporter: Reporter | None = None
) -> SearchResult:
    """Run the trials of an opened study (a training one, or a generation one: `search.generate`),
    confirm the leaders, write the best recipe, and say why the search stopped."""
    study, ctx, name, url = opened.study, opened.ctx, opened.name, opened.url
    if is_sqlite(url):
        warn_if_sqlite_shared(study, url)

    salvage = Salvage(study, name, url, recipe_path(settings, name))
    ran = 0

    def after_trial(study: optuna.Study, trial: FrozenTrial) -> None:
        nonlocal ran
        ran += 1
        salvage.finished(trial)
        if reporter:
            reporter.trial_finished(TrialRecord.read(trial, study.user_attrs), summarize(study))

    settled: list[str] = []

    def settle(study: optuna.Study, trial: FrozenTrial) -> None:
        # The planner's rule, after every trial: nothing left is expected to gain more than the noise.
        if isinstance(study.sampler, PlannerSampler) and ran < (settings.trial_cap or 1 << 30):
            why = study.sampler.stop_reason(study)
            if why is not None:
                settled.append(why)
                study.stop()

    callbacks: list = [after_trial, settle]
    stop: KeyboardInterrupt | None = None
    full: DiskFull | None = None
    try:
        with _stops_through_optuna():
            optimize(study, objective, n_trials=settings.trial_cap, timeout_s=settings.timeout_s, callbacks=callbacks)
        if settings.confirm:
            confirm_leaders(study, summarize(study).leaders, ctx, reporter)
        if getattr(ctx.spec, "nproc_per_node", 1) > 1:  # the best on one rank: its scaling efficiency
            from autotune.search.scaling import measure_single_rank

            measure_single_rank(study, summarize(study), ctx)
    except KeyboardInterrupt as exc:  # Ctrl-C, or Stopped for SIGTERM / SIGHUP
        stop = exc
        objective.record_stop(stop_signal_of(exc))
    except DiskFull as exc:  # the trials' folder or a file of a trial: every trial after it would fail alike
        full = exc
    except (Exception, StudyNotWritable) as exc:  # the study's storage, or a disk, failed mid-study
        failure = salvage.failure(exc)
        if failure is None:
            raise
        raise salvage.stopped(failure, objective.measured) from None
    summary = summarize(study)
    path = None
    if summary.best is not None:
        path = write_recipe(study, summary, name, url, settings.recipe)
    if stop is not None:
        stopped = interrupted_stop(signal.Signals(stop_signal_of(stop)).name)
    elif full is not None:
        stopped = no_room_stop(str(full))
    elif settled:
        stopped = settled_stop(settled[-1])
    else:
        doubt = study.sampler.doubt() if isinstance(study.sampler, PlannerSampler) else None
        stopped = budget_stop(
            ran=ran,
            n_trials=settings.trial_cap,
            timeout_s=settings.timeout_s,
            cap=settings.n_trials is None,
            doubt=doubt,
        )
    result = SearchResult(study, summary, ctx, url, path, opened.is_new, stopped=stopped, stages=stage_counts(summary))
    if stop is not None:
        raise SearchInterrupted(result, stop_signal_of(stop))
    if full is not None:
        raise SearchOutOfRoom(result, full)
    return result


@contextlib.contextmanager
def _stops_through_optuna() -> Iterator[None]:
    """A stop signal that lands inside Optuna's own bookkeeping (its recording of a trial's end)
    can break it: its `finally` then fails with an UnboundLocalError raised while handling the
    KeyboardInterrupt. That error is the stop, and is raised as the stop it was."""
    try:
        yield
    except Exception as exc:
        stop = stop_behind(exc)
        if stop is None:
            raise
        raise stop from None


def stage_counts(summary: StudySummary) -> dict[str, int]:
    """The study's trials by what proposed them: the references, a warm start, each stage of the
    planner (search.planner: the expert prior, kernels, budget and memory, data loader)."""
    counts: dict[str, int] = {}
    for t in summary.trials:
        if not t.finished:
            continue
        stage = t.reference and "reference" or t.proposed_by or "enqueued"
        counts[stage] = counts.get(stage, 0) + 1
    return counts


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


class SearchStopped(AutotuneError):
    """A search that stopped before its end with its result kept (the trial it was running
    recorded, the best so far written): the command line prints its summary, then this line."""

    def __init__(self, message: str, result: SearchResult) -> None:
        super().__init__(message + (f"; the best so far is in {result.recipe_path}" if result.recipe_path else ""))
        self.result = result


class SearchInterrupted(SearchStopped):
    """Ctrl-C, SIGTERM or SIGHUP: the running trial was killed and recorded; the best so far
    was written. Exit 128 + the signal: 130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP)."""

    def __init__(self, result: SearchResult, signum: int = 2) -> None:
        how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        super().__init__(f"{how}: the running trial was stopped and recorded", result)
        self.signum = signum
        self.exit_code = exit_code_for(self)


class SearchOutOfRoom(SearchStopped):
    """A disk the trials write to has no room left (their temporary folder, a file a trial
    writes): the trial that met it is recorded `interrupted` with the disk and the path, the best
    so far written, exit 1. Every trial after it would fail the same way, each recorded as a
    crash of its configuration."""

    def __init__(self, result: SearchResult, full: DiskFull) -> None:
        super().__init__(f"the search stopped: {full}; the trials recorded so far are kept", result)
