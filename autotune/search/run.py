"""`autotune search` as a library call: settings in, a study and the best recipe out; one path
for every task (`search.task`: training, generation).

Everything is checked before anything is written or run (`search.preflight`). A resumed study
keeps its rules (`search.task.resume`). SIGTERM and SIGHUP stop a search as Ctrl-C does (the CLI
turns them into `Stopped`): the running trial is recorded interrupted and the best so far is
written.

Printing belongs to the caller: progress goes through a `Reporter` (the CLI's draws a bar)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.device.info import busy_host
from autotune.errors import AutotuneError, DiskFull
from autotune.measure import outcomes
from autotune.recipe.from_study import write_recipe
from autotune.search.confirm import confirm_leaders
from autotune.search.objective import Objective, StudyNotWritable
from autotune.search.optimize import optimize
from autotune.search.preflight import preflight, recipe_path
from autotune.search.references import enqueue_references, retry_interrupted_references
from autotune.search.salvage import Salvage
from autotune.search.sampler import PlannerSampler
from autotune.search.settings import SearchSettings
from autotune.search.stopping import SearchStop, budget_stop, interrupted_stop, no_room_stop, settled_stop
from autotune.search.task import Task, resume
from autotune.study import record
from autotune.study.lifecycle import open_study, worker_seed
from autotune.study.record import TrialRecord
from autotune.study.storage import RetryStaleTrial, heartbeat_grace_s, internals, open_storage
from autotune.study.summary import StudySummary, summarize
from autotune.study.urls import is_sqlite, parse_storage_url, redact
from autotune.trial.processes import exit_code_for, process_alive, stop_behind, stop_signal_of, stop_signals_raise

log = logging.getLogger(__name__)


class Reporter(Protocol):
    def trial_started(self, number: int, cfg: Any) -> None: ...
    def trial_finished(self, trial: TrialRecord, summary: StudySummary) -> None: ...
    def confirming(self, number: int, index: int, count: int) -> None: ...


@dataclass
class SearchResult:
    study: optuna.Study
    summary: StudySummary
    task: Task
    storage_url: str
    recipe_path: Path | None
    new_study: bool
    worker_failures: list[str] = field(default_factory=list)  # --devices: workers that did not end well
    stopped: SearchStop | None = None  # why the search stopped
    stages: dict[str, int] = field(default_factory=dict)  # trials by what proposed them (stage_counts)


@dataclass
class OpenedStudy:
    study: optuna.Study
    is_new: bool
    task: Task
    name: str
    url: str


def open_search(settings: SearchSettings) -> OpenedStudy:
    """Check everything (`search.preflight`), then open or resume the study: what `search` and the
    `--devices` parent share. A refused run has created nothing."""
    pre = preflight(settings)
    task, name, url = pre.task, pre.name, pre.url
    storage = open_storage(url, grace_period_s=heartbeat_grace_s(url))
    if parse_storage_url(url).in_memory:
        log.warning("storage %s is in memory: the study is gone when this search ends (the recipe is written)", url)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our reporter says what happened

    def on_create(study: optuna.Study) -> None:
        # Once per study, by the process that creates it: never again on resume, nor by the
        # other workers of --devices. The references first (the yardsticks), then a warm start:
        # measured evidence from a study like this one, before the sampler's own proposals.
        if settings.references:
            enqueue_references(study)
        if pre.warm is not None:
            pre.warm.enqueue(study)

    study, is_new = open_study(name, storage, task, sampler=task.sampler, seed=settings.seed, on_create=on_create)
    if not is_new:
        task = resume(study, task, settings)
        if pre.warm is not None:
            log.warning(
                "study %r exists: --warm-start-from applies to a new study only and is ignored (start one with "
                "--new-study)",
                name,
            )
        study.sampler = task.sampler(worker_seed(settings.seed, len(study.trials)))  # its own limit, headroom
    orphans = fail_orphaned_trials(study)
    if orphans:
        log.warning("failed %d trial(s) left running by a killed tuner: %s", len(orphans), orphans)
    if not is_new and (retried := retry_interrupted_references(study)):
        log.warning("running the interrupted reference trial(s) again: %s", ", ".join(retried))
    return OpenedStudy(study, is_new, task, name, url)


def fail_orphaned_trials(study: optuna.Study) -> list[int]:
    """RUNNING trials left by a tuner of this host that is gone (killed with -9, power cut)
    are failed now (outcome interrupted), without waiting for the heartbeat grace period,
    and retried once. The journal file has no heartbeats: this is what unsticks it."""
    failed = []
    host = socket.gethostname()
    storage, study_id = internals(study)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = t.user_attrs.get("tuner_pid")
        if t.user_attrs.get("host") != host or pid is None or (process_alive(pid) and pid != os.getpid()):
            continue
        left = record.fail_left_running(storage, study_id, t.number, *outcomes.orphaned())
        if left is None:  # finished meanwhile
            continue
        failed.append(t.number)
        # Retried once, as a heartbeat-stale trial is (reference trials too: without them
        # the study would never report its speedups).
        RetryStaleTrial(max_retry=1)(study, left)
    return failed


def run_search(settings: SearchSettings, reporter: Reporter | None = None) -> SearchResult:
    """Run or resume the study (see the module's docstring). The first stop signal stops it in
    order; the ones after it are absorbed until the trial is recorded and the recipe written
    (`stop_signals_raise`)."""
    with stop_signals_raise():
        return _run_search(settings, reporter)


def _run_search(settings: SearchSettings, reporter: Reporter | None) -> SearchResult:
    opened = open_search(settings)
    if busy := busy_host():
        log.warning("%s", busy)
    on_running = reporter.trial_started if reporter else None
    objective = Objective(opened.task, on_running=on_running, memory_model=settings.memory_model)
    return search_study(opened, objective, settings, reporter)


def search_study(
    opened: OpenedStudy, objective: Objective, settings: SearchSettings, reporter: Reporter | None = None
) -> SearchResult:
    """Run the trials of an opened study (of any task), confirm the leaders, write the best
    recipe, and say why the search stopped."""
    study, task, name, url = opened.study, opened.task, opened.name, opened.url
    if is_sqlite(url):
        warn_if_sqlite_shared(study, url)  # a tuner at work before this one

    salvage = Salvage(study, name, url, recipe_path(settings, name))
    ran = 0
    shared = not is_sqlite(url)  # SQLite: warned of once, when another tuner is seen on it

    def after_trial(study: optuna.Study, trial: FrozenTrial) -> None:
        nonlocal ran, shared
        ran += 1
        salvage.finished(trial)
        shared = shared or warn_if_sqlite_shared(study, url)  # one that started after this one
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
            confirm_leaders(study, summarize(study).leaders, task, reporter)
        if task.ranks > 1:  # the best on one rank: its scaling efficiency
            from autotune.search.scaling import measure_single_rank

            measure_single_rank(study, summarize(study), task)
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
    result = SearchResult(study, summary, task, url, path, opened.is_new, stopped=stopped, stages=stage_counts(summary))
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
