"""The objective: turns an Optuna trial into a configuration, runs it isolated, and
records its outcome on the trial (as `measure.outcomes.recording` says). A configuration
the study's memory model predicts over the limit by a clear margin is recorded without
running (`predicted_over_limit`, see `search.memory_model`)."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from autotune.errors import DiskFull, UsageError
from autotune.measure import outcomes
from autotune.search.memory_model import memory_context, skip_prediction
from autotune.search.planner import REMEASURE
from autotune.search.sampler import PlannerSampler
from autotune.search.task import Task
from autotune.study import record
from autotune.study.leaders import objective_value
from autotune.study.record import read_trials
from autotune.study.references import REFERENCE_ATTR
from autotune.study.storage_errors import StorageError
from autotune.trial.processes import stop_signal_of
from autotune.trial.runner import TrialResult

log = logging.getLogger(__name__)


class TrialFailed(Exception):
    """Raised from the objective for timeout/crashed/interrupted: Optuna records FAIL."""


class StudyNotWritable(BaseException):
    """Raised from the objective when the study cannot be written (a full disk, a lock held past
    the wait): the search stops. Not an Exception, so that Optuna lets it through instead of
    recording the trial FAIL, which is final (a measured trial would be lost for good, and the
    record of the failure cannot be written either): the trial stays RUNNING, and the next
    search fails it as interrupted and measures it again, as after a kill."""

    def __init__(self, error: StorageError) -> None:
        super().__init__(str(error))
        self.error = error


class TrialTakenOver(BaseException):
    """Raised from the objective when its trial was finished by another worker meanwhile: this
    worker's heartbeats stood still past the grace period (it was paused, suspended, or cut off
    from the database), so another worker failed the trial and queued it again. Nothing is
    written over it. Not an Exception, for Optuna would then record it FAIL, and a finished trial
    cannot be told again ("Cannot tell a FAIL trial"): `search.optimize` says so and goes on."""

    def __init__(self, number: int, measured: record.TrialRecord | None) -> None:
        result = (
            f"this result ({measured.tokens_per_sec:,.0f} tok/s)"
            if measured and measured.tokens_per_sec
            else "its result"
        )
        super().__init__(
            f"trial {number}: another worker failed it while this worker was stopped for longer than the heartbeat "
            f"grace period, and queued it again; {result} is not recorded"
        )


class Objective:
    """Turns a trial into a configuration of its task, runs it isolated, and records its outcome."""

    def __init__(
        self,
        task: Task,
        on_running: Callable[[int, Any], None] | None = None,
        trial_env: dict[str, str] | None = None,
        *,
        memory_model: bool = True,
    ) -> None:
        self.task = task
        self.on_running = on_running
        self.trial_env = trial_env
        self.memory_model = memory_model and task.predicts_memory
        self.prune_below: float | None = None  # this trial's: the planner's best less a margin
        self.measure_again = False  # this trial's: proposed because its configuration's reading was a bad one
        # The running trial as it will be stored once measured, kept in memory for a study that
        # cannot be written (search.salvage); None until a figure is measured.
        self.measured: record.TrialRecord | None = None
        self.calls = 0  # trials begun (search.optimize counts them)
        self.refused = 0  # of them, refused before any process started: they cost nothing
        self.current: optuna.Trial | None = None  # the trial last handed to this objective

    def __call__(self, trial: optuna.Trial) -> float:
        self.measured = None
        self.calls += 1
        self.current = trial
        try:
            return self._trial(trial)
        except StorageError as exc:
            raise StudyNotWritable(exc) from exc
        except optuna.exceptions.UpdateFinishedTrialError:
            raise TrialTakenOver(trial.number, self.measured) from None

    def _trial(self, trial: optuna.Trial) -> float:
        reference = trial.user_attrs.get(REFERENCE_ATTR)
        self.prune_below, self.measure_again = None, False
        try:
            cfg = self.task.configure(trial, reference)
        except UsageError as exc:  # drawn knobs the registry's own rules refuse together: no configuration
            self.refused += 1
            return self._record(trial, TrialResult(outcomes.UNSUPPORTED, str(exc)))
        if not reference:
            self._note_proposal(trial)
        trial.set_user_attr(record.CONFIG, cfg.to_dict())
        trial.set_user_attr(record.HOST, socket.gethostname())
        trial.set_user_attr(record.TUNER_PID, os.getpid())
        if self.task.device.uuid:  # which GPU of a multi-GPU or multi-host study ran it
            trial.set_user_attr(record.DEVICE_UUID, self.task.device.uuid)
        refusal = self.task.refusal(cfg)
        if refusal is not None:  # known-impossible: recorded and pruned at no cost, no process starts
            self.refused += 1
            return self._record(trial, TrialResult(outcomes.UNSUPPORTED, refusal))
        if self.memory_model and not reference and self._predicted_over_limit(trial, cfg):
            return 0.0
        result = (None if self.measure_again else self._reuse(trial, cfg)) or self._run(trial, cfg)
        return self._record(trial, result)

    def _predicted_over_limit(self, trial: optuna.Trial, cfg: Any) -> bool:
        """Record `cfg` as predicted over the limit, without running it, when the study's trials
        say so by a clear margin; False (and nothing recorded) otherwise. The reference trials
        are never skipped: they are the yardsticks of every study. Over the limit means over
        what feasibility allows, the limit less the headroom, as for a measured peak."""
        limit, headroom = self.task.memory_limit_bytes, self.task.memory_headroom
        target = outcomes.feasible_peak_bytes(limit, headroom)
        sampler = trial.study.sampler  # its records, read before this trial: each finished one made once
        reader = sampler.records.read if isinstance(sampler, PlannerSampler) else read_trials
        records = [r for r in reader(trial.study) if r.number != trial.number]
        prediction = skip_prediction(records, cfg.to_dict(), target, memory_context(self.task))
        if prediction is None:
            return False
        _, reason = outcomes.skipped_over_limit(prediction.peak_bytes, limit, headroom, prediction.basis)
        record.write_skipped(trial, reason, prediction.peak_bytes, prediction.basis, prediction.trials)
        # The sampler learns "this region does not fit" as it does from a measured peak.
        trial.set_constraint(record.MEMORY, prediction.constraint(limit, headroom))
        log.info("trial %d: %s", trial.number, reason)
        return True

    def _note_proposal(self, trial: optuna.Trial) -> None:
        """What proposed this trial and why (the planner's stage, its expectations), and the
        threshold below which its timed window stops short (clearly worse than the best)."""
        sampler = trial.study.sampler
        proposal = sampler.proposal_for(trial.number) if isinstance(sampler, PlannerSampler) else None
        if proposal is None:
            return
        trial.set_user_attr(record.PROPOSED_BY, proposal.stage.replace(" ", "_"))
        trial.set_user_attr(record.PLAN, proposal.to_attrs())
        self.prune_below = proposal.prune_below
        self.measure_again = proposal.stage == REMEASURE  # its earlier reading was a bad one: not reused

    def _reuse(self, trial: optuna.Trial, cfg: Any) -> TrialResult | None:
        """TPE re-proposes configurations it has seen; a deterministic outcome is not re-run."""
        key = cfg.to_dict()
        for frozen in trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            done = record.TrialRecord.read(frozen)
            if (
                done.damage is None
                and done.config == key
                and done.outcome is not None
                and outcomes.reusable(done.outcome)
            ):
                trial.set_user_attr(record.DUPLICATE_OF, done.number)
                return TrialResult(done.outcome, done.reason, done.measurement)
        return None

    def _run(self, trial: optuna.Trial, cfg: Any) -> TrialResult:
        if self.on_running:
            self.on_running(trial.number, cfg)
        try:
            return self._measure(cfg, on_start=lambda pid: trial.set_user_attr(record.TRIAL_PID, pid))
        except KeyboardInterrupt as exc:  # Ctrl-C, or Stopped for SIGTERM / SIGHUP
            record.write_stopped(trial, *outcomes.interrupted_by_user(stop_signal_of(exc)))
            raise
        except DiskFull as exc:  # no fault of the configuration: it may be run again once there is room
            record.write_stopped(trial, outcomes.INTERRUPTED, str(exc))
            raise

    def record_stop(self, signum: int) -> None:
        """After a stop signal: the trial this objective ran, when Optuna could not record its
        end (the signal landed in Optuna's own bookkeeping, which then leaves it RUNNING), is
        recorded interrupted now, and FAIL."""
        trial = self.current
        if trial is None:
            return
        running = trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if any(t.number == trial.number for t in running):
            record.write_stopped(trial, *outcomes.interrupted_by_user(signum))
            trial.study.tell(trial, state=TrialState.FAIL)

    def _measure(self, cfg: Any, *, on_start: Callable[[int], None]) -> TrialResult:
        """`cfg` measured in a trial process of its own."""
        return self.task.measure(cfg, on_start=on_start, prune_below=self.prune_below, env=self.trial_env)

    def _record(self, trial: optuna.Trial, result: TrialResult) -> float:
        m = result.measurement
        how = outcomes.recording(result.outcome, has_rate=result.tokens_per_sec is not None)
        constraints = self._constraints(how, result)

        def write(target) -> None:  # the trial, or its copy in memory
            record.write_result(target, result.outcome, result.reason, m, phase_s=result.phase_s, wall_s=result.wall_s)
            for name, value in constraints.items():
                target.set_constraint(name, value)

        value = objective_value(m.to_dict(), self.task.objective) if how is outcomes.Recording.MEASURED else None
        if value is not None:
            self.measured = record.as_completed(trial, float(value), write)
        write(trial)
        if how is outcomes.Recording.MEASURED:
            if value is None:  # tokens_per_joule, and this run read no energy (energy_note says why)
                raise TrialFailed(f"no {self.task.objective} figure: {m.energy_note or 'no energy reading'}")
            return float(value)
        if how is outcomes.Recording.INFEASIBLE:
            return 0.0
        if how is outcomes.Recording.PRUNED:
            raise optuna.TrialPruned(result.reason)
        raise TrialFailed(f"{result.outcome}: {(result.reason or '').splitlines()[0] if result.reason else ''}")

    def _constraints(self, how: outcomes.Recording, result: TrialResult) -> dict[str, float]:
        """The trial's constraints by name (each feasible when <= 0): from its peak when
        measured (and the task's own), 1 when it did not fit."""
        if how is outcomes.Recording.INFEASIBLE:
            return {record.MEMORY: 1.0}
        if how is not outcomes.Recording.MEASURED:
            return {}
        limit, headroom = self.task.memory_limit_bytes, self.task.memory_headroom
        memory = outcomes.memory_constraint(result.peak_memory_bytes, limit, headroom)
        return {record.MEMORY: memory, **self.task.constraints(result)}
