"""One trial of a study as a typed record, read from an Optuna `FrozenTrial` in one place
(`TrialRecord.read`) and written in one place (`write_result`, `write_skipped`, `write_stopped`).

A trial's user attrs are its record on disk: readable names and plain JSON values, so that
optuna-dashboard shows them as they are. Every reader of a study (the summary, `show`,
`compare`, `report`, a warm start, the memory model, the recipe) reads them through this type,
and decides feasibility by one rule (`TrialRecord.feasible`):

    feasible  =  COMPLETE, outcome ok, and every constraint <= 0 where one is recorded (memory; a
                 generation study's recompiles and latency bounds)

The outcome of a measured run is decided against the limit less the study's headroom (what a
feasible worst-case peak may be), so `ok` and feasible say the same thing. A study recorded
before that rule judged `ok` against the raw limit; such a trial whose constraint says it is
over the limit less the headroom reads back as `over_memory_limit`, with the reason. A figure
that is not finite (an objective of +inf, a tokens/s of NaN: no run measures one, so the study was
edited or damaged) makes its trial no measurement: it reads with no outcome, figures or value,
and a reason saying which figure (issue D, E03/E05).

The figure a presenter shows for a trial is its `figure`: the mean of its runs once its
re-measurement (the confirmation run, a study attr) reproduced it, else its single run; that is
what the recipe records. `single_tokens_per_sec` is the trial's own run, shown beside it where
they differ.

A damaged trial (a hand-edited or torn database: an attribute whose stored JSON the storage could
not decode, a measured trial without its configuration or its tokens/s) reads as a record whose
`damage` says what is wrong; `read_trials` leaves it out, with one warning line naming it, so no
reader meets it (issue D, E01/E02). Torch-free."""

from __future__ import annotations

import logging
import math
import statistics
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from optuna.trial import FrozenTrial, TrialState

from autotune.config import normalize_config_dict
from autotune.measure import outcomes
from autotune.measure.measurement import Measurement
from autotune.measure.outcomes import Outcome
from autotune.study.references import REFERENCE_ATTR

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

# The user attrs of a trial, by name: what the objective writes and every reader reads.
OUTCOME, REASON, CONFIG, MEASUREMENT = "outcome", "reason", "config", "measurement"
TOKENS_PER_SEC, PEAK, CI95, JOULES = "tokens_per_sec", "peak_memory_bytes", "tokens_per_sec_ci95", "joules_per_token"
PHASE_S, WALL_S = "phase_s", "wall_s"
DUPLICATE_OF = "duplicate_of"  # a re-proposed configuration: its outcome copied from this trial
PREDICTED_PEAK, MEMORY_BASIS, MEMORY_BASIS_TRIALS = (
    "predicted_peak_memory_bytes",
    "memory_basis",
    "memory_basis_trials",
)
PROPOSED_BY = "proposed_by"  # which stage of the planner proposed it (search.planner); absent: enqueued
PLAN = "plan"  # the planner's expectations of it: reason, predicted tokens/s and peak, p_fit, seconds
EXPERT_START = "expert_start"  # older studies: the expert-start trial's label
HOST, TUNER_PID, TRIAL_PID, DEVICE_UUID = "host", "tuner_pid", "trial_pid", "device_uuid"
REASON_LIMIT = 4000  # characters of a reason kept in storage
MEMORY = "memory"  # the name of the memory constraint
# A generation study's bounds besides memory, by constraint name (`search.generate` records them),
# with the option that sets each: a run over one ended ok, but it is never the best.
P99_TOKEN_LATENCY, TTFT = "p99_token_latency", "ttft"
BOUND_OPTIONS = {P99_TOKEN_LATENCY: "--max-p99-token-latency", TTFT: "--max-ttft"}
OVER_BOUND = "over_bound"  # how a trial that ran ok over such a bound shows (its line, the counts)

# The system attr in which the storage names a trial's attributes whose JSON did not decode, left
# out of the trial (study.guarded)
DAMAGED_ATTRS = "autotune:damaged_attrs"

# A trial's re-measurement is a study attr (a trial's own attrs cannot change once it is done).
CONFIRMATION_PREFIX = "confirmation:"
AGAIN = "again"  # a confirmation's further readings
# Student's t at 97.5 % by degrees of freedom: the 95 % interval of a mean of a few runs
T_975 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def confirmation_key(trial_number: int) -> str:
    """The study attr holding the re-measurement of this trial."""
    return f"{CONFIRMATION_PREFIX}{trial_number}"


@dataclass(frozen=True)
class Confirmation:
    """A trial's configuration measured once more, in a fresh process (`search.confirm`)."""

    outcome: Outcome | None
    tokens_per_sec: float | None = None
    tokens_per_sec_ci95: list[float] | None = None
    joules_per_token: float | None = None
    peak_memory_bytes: int | None = None
    # tokens/s of further fresh runs, each ok, taken to tell near-tied leaders apart
    # (`study.leaders.tied`); absent from the record when there are none, as in older studies
    again: tuple[float, ...] = ()

    @property
    def reproduced(self) -> bool:
        return self.outcome is Outcome.OK and bool(self.tokens_per_sec)

    def to_dict(self) -> dict[str, Any]:
        out = {
            OUTCOME: self.outcome,
            TOKENS_PER_SEC: self.tokens_per_sec,
            CI95: self.tokens_per_sec_ci95,
            JOULES: self.joules_per_token,
            PEAK: self.peak_memory_bytes,
        }
        return out | ({AGAIN: list(self.again)} if self.again else {})

    @classmethod
    def read(cls, data: Any) -> "Confirmation | None":
        if not isinstance(data, Mapping):
            return None
        again = data.get(AGAIN)
        return cls(
            Outcome.read(data.get(OUTCOME)),
            _number(data.get(TOKENS_PER_SEC)),
            data.get(CI95) if isinstance(data.get(CI95), list) else None,
            _number(data.get(JOULES)),
            _integer(data.get(PEAK)),
            tuple(v for v in map(_number, again) if v) if isinstance(again, list) else (),
        )


@dataclass(frozen=True)
class TrialRecord:
    """A finished (or running) trial, as the tuner recorded it."""

    number: int
    state: TrialState
    outcome: Outcome | None  # None: still running, or a trial autotune did not write
    reason: str | None = None
    config: dict[str, Any] | None = None  # knob values (TrainConfig.to_dict(), normalized)
    measurement: Measurement | None = None
    value: float | None = None  # Optuna's value: the objective's figure
    memory_constraint: float | None = None  # <= 0 feasible (outcomes.memory_constraint)
    # Every constraint by name (memory; a generation study's recompiles and latency bounds too):
    # feasible only with each <= 0
    constraints: dict[str, float] = field(default_factory=dict)
    tokens_per_sec: float | None = None  # this trial's own run
    peak_memory_bytes: int | None = None
    reference: str | None = None  # baseline, checklist
    proposed_by: str | None = None  # the search stage that proposed it; None: the sampler
    duplicate_of: int | None = None
    predicted_peak_memory_bytes: int | None = None
    memory_basis: str | None = None
    wall_s: float | None = None
    phase_s: dict[str, float] = field(default_factory=dict)
    confirmation: Confirmation | None = None
    host: str | None = None
    tuner_pid: int | None = None
    damage: str | None = None  # what is wrong with a damaged trial; None: it is whole

    @classmethod
    def read(cls, trial: FrozenTrial, study_attrs: Mapping[str, Any] | None = None) -> "TrialRecord":
        """The record of `trial`; `study_attrs` (the study's) give its confirmation run."""
        a = trial.user_attrs
        config = a.get(CONFIG)
        config = normalize_config_dict(config) if isinstance(config, Mapping) else None
        stored = a.get(MEASUREMENT)
        measurement = None
        if isinstance(stored, Mapping) and stored:
            # What the trial itself records stands in for keys an older or partial record lacks.
            known = {CONFIG: config or {}, OUTCOME: a.get(OUTCOME) or "unknown"}
            measurement = Measurement.from_dict({**known, **stored})
        outcome, reason = Outcome.read(a.get(OUTCOME)), a.get(REASON)
        value = trial.value if trial.state is TrialState.COMPLETE else None
        tokens_per_sec = a.get(TOKENS_PER_SEC)
        not_finite = _not_finite(
            {
                "objective value": value,
                TOKENS_PER_SEC: tokens_per_sec,
                "measurement tokens_per_sec": measurement.tokens_per_sec if measurement else None,
            }
        )
        if not_finite:
            # No run measures an infinite or NaN rate: a study edited by hand, or damaged. Such a
            # trial is no measurement: nothing shows, learns from or ranks by its figures (an
            # objective of +inf made the slowest trial the recipe).
            outcome, measurement, value, tokens_per_sec = None, None, None, None
            reason = f"not a measurement: its recorded figures are not finite ({not_finite})"
        constraint = (trial.constraints or {}).get(MEMORY) if trial.constraints else None
        if constraint is None and trial.constraints:
            constraint = max(trial.constraints.values())
        if outcome is Outcome.OK and constraint is not None and constraint > 0:
            # Judged against the raw limit by an older autotune; over the limit less the headroom.
            outcome = Outcome.OVER_MEMORY_LIMIT
            reason = reason or "peak memory above the study's limit less its headroom (judged ok by an older autotune)"
        if outcome is Outcome.OK and not reason:
            reason = _over_bounds(trial.constraints or {})
        proposed = a.get(PROPOSED_BY) or (a.get(EXPERT_START) and "expert_start") or None
        return cls(
            number=trial.number,
            state=trial.state,
            outcome=outcome,
            reason=reason if isinstance(reason, str) else None,
            config=config,
            measurement=measurement,
            value=value,
            memory_constraint=constraint,
            constraints=dict(trial.constraints or {}),
            tokens_per_sec=_number(tokens_per_sec),
            peak_memory_bytes=_integer(a.get(PEAK)),
            reference=a.get(REFERENCE_ATTR) if isinstance(a.get(REFERENCE_ATTR), str) else None,
            proposed_by=proposed if isinstance(proposed, str) else None,
            duplicate_of=_integer(a.get(DUPLICATE_OF)),
            predicted_peak_memory_bytes=_integer(a.get(PREDICTED_PEAK)),
            memory_basis=a.get(MEMORY_BASIS) if isinstance(a.get(MEMORY_BASIS), str) else None,
            wall_s=_number(a.get(WALL_S)),
            phase_s=dict(a.get(PHASE_S)) if isinstance(a.get(PHASE_S), Mapping) else {},
            confirmation=Confirmation.read((study_attrs or {}).get(confirmation_key(trial.number))),
            host=a.get(HOST) if isinstance(a.get(HOST), str) else None,
            tuner_pid=_integer(a.get(TUNER_PID)),
            damage=_damage(trial, outcome, config, _number(a.get(TOKENS_PER_SEC))),
        )

    # --- the one feasibility rule, and what a trial says -----------------------------------------

    @property
    def feasible(self) -> bool:
        """Measured, fits the limit less the headroom, and trained: it may be the best."""
        return (
            self.state is TrialState.COMPLETE
            and self.outcome is Outcome.OK
            and (self.memory_constraint is None or self.memory_constraint <= 0)
            and all(value <= 0 for value in self.constraints.values())
        )

    @property
    def broken_bounds(self) -> list[str]:
        """The options of the bounds this trial's figures break (a generation study's latency
        bounds): what keeps a trial that ran ok from being feasible."""
        return [option for name, option in BOUND_OPTIONS.items() if self.constraints.get(name, 0.0) > 0]

    @property
    def status(self) -> str:
        """How the trial shows: its outcome, `over_bound` when it ran ok but over a bound (an `ok`
        there would read as a candidate), its state when it has no outcome (running)."""
        if self.outcome is Outcome.OK and self.broken_bounds:
            return OVER_BOUND
        return str(self.outcome) if self.outcome else self.state.name.lower()

    @property
    def measured(self) -> bool:
        """It ran to the end of a timed window and has a throughput (it may not fit)."""
        return self.outcome in outcomes.MEASURED and self.tokens_per_sec is not None

    @property
    def finished(self) -> bool:
        return self.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

    @property
    def unstable(self) -> bool:
        return bool(self.measurement and self.measurement.unstable)

    @property
    def step_time_cv(self) -> float | None:
        return self.measurement.step_time_cv if self.measurement else None

    @property
    def runs(self) -> tuple[float, ...]:
        """Its tokens/s: its own run, then its re-measurement where that reproduced it, then the
        further runs that told it from a near-tie (`Confirmation.again`)."""
        if self.tokens_per_sec is None:
            return ()
        if self.confirmation is not None and self.confirmation.reproduced:
            return (self.tokens_per_sec, float(self.confirmation.tokens_per_sec), *self.confirmation.again)
        return (self.tokens_per_sec,)

    @property
    def figure(self) -> float | None:
        """The tokens/s a presenter shows and the recipe records: the mean of its runs."""
        runs = self.runs
        return sum(runs) / len(runs) if runs else None

    @property
    def figure_ci95(self) -> list[float] | None:
        """The 95 % interval of `figure`: the run's own for a single run; for the mean of the run
        and its re-measurement, the interval of that mean from the two runs' intervals (half-width
        sqrt(h1^2 + h2^2) / 2, independent runs), and None where either run has none or the two
        differ by more than their intervals allow (|a - b| > sqrt(h1^2 + h2^2), the 95 % test of a
        difference): then what moved between the runs is not in either interval, and two runs
        cannot say how much it is. Never the first run's interval beside the mean (issue D, #4).
        Over three runs or more, each in a fresh process: the interval of their mean from their
        own spread (Student's t), which holds what moves between processes."""
        own = self.measurement.tokens_per_sec_ci95 if self.measurement else None
        if not self.confirmed:
            return list(own) if own else None
        if len(self.runs) > 2:
            n, mean = len(self.runs), self.figure
            half = T_975.get(n - 1, 1.96) * statistics.stdev(self.runs) / math.sqrt(n)
            return [mean - half, mean + half]
        second = self.confirmation.tokens_per_sec_ci95 if self.confirmation else None
        if not own or not second:
            return None
        (a, b), (h1, h2) = self.runs, ((own[1] - own[0]) / 2, (second[1] - second[0]) / 2)
        spread = math.hypot(h1, h2)
        if abs(a - b) > spread:
            return None
        mean = self.figure
        return [mean - spread / 2, mean + spread / 2]

    @property
    def confirmed(self) -> bool:
        return len(self.runs) > 1

    @property
    def label(self) -> str:
        """How a table names it: #N, with what proposed it."""
        by = self.reference or self.proposed_by
        return f"#{self.number}" + (f" ({by})" if by else "")


def _damage(trial: FrozenTrial, outcome: Outcome | None, config: Any, tokens_per_sec: float | None) -> str | None:
    """What makes `trial` unusable, or None: attributes the storage could not decode, or a measured
    trial missing what every reader takes from it (an unsupported draw has no configuration, a run
    the RSS watchdog stopped over the limit has no tokens/s: neither is damage)."""
    unreadable = trial.system_attrs.get(DAMAGED_ATTRS)
    if unreadable:
        return f"its attribute {', '.join(map(str, unreadable))} is not JSON (the database is damaged)"
    if outcome in outcomes.MEASURED and config is None:
        return f"measured ({outcome}) with no configuration (attribute {CONFIG!r} missing or not a mapping)"
    if outcome is Outcome.OK and tokens_per_sec is None:
        return f"measured ok with no tokens/s (attribute {TOKENS_PER_SEC!r} missing)"
    return None


# The damaged trials said already, per study object: a command reads its study several times.
_said: "weakref.WeakKeyDictionary[optuna.Study, set[int]]" = weakref.WeakKeyDictionary()


def whole(study: "optuna.Study", records: list[TrialRecord]) -> list[TrialRecord]:
    """`records` less the damaged ones, each said once for `study` in one warning line naming
    the trial and what is wrong with it."""
    said = _said.setdefault(study, set())
    for r in records:
        if r.damage is not None and r.number not in said:
            said.add(r.number)
            log.warning("study %s: trial #%d skipped: %s", study.study_name, r.number, r.damage)
    return [r for r in records if r.damage is None]


def read_trials(study: "optuna.Study", study_attrs: Mapping[str, Any] | None = None) -> list[TrialRecord]:
    """Every whole trial of `study`, as records, in trial order (`study_attrs`: the study's, when
    read already); a damaged one is left out, with a warning (`whole`)."""
    attrs = study.user_attrs if study_attrs is None else study_attrs
    return whole(study, [TrialRecord.read(t, attrs) for t in study.get_trials(deepcopy=False)])


class RecordCache:
    """`read_trials` for a reader that reads the same study before and after every trial (the
    sampler, the objective's memory check): a finished trial's record is made once, not once per
    read. Making one validates its configuration (about a millisecond), so reading every record
    anew made the tuner's own time grow with the study, to seconds per trial at 200 trials
    (benchmarks/tuner_overhead.py). A finished trial's record is made again only when what it
    is read from changes: its state, values or attributes, or its confirmation run (a study attr)."""

    def __init__(self) -> None:
        # trial number -> (what it was read from, record); a reader serves one study (a sampler's),
        # and the trial's start time in what it was read from tells another study's trial apart
        self._finished: dict[int, tuple[Any, TrialRecord]] = {}

    def read(self, study: "optuna.Study", study_attrs: Mapping[str, Any] | None = None) -> list[TrialRecord]:
        attrs = study.user_attrs if study_attrs is None else study_attrs
        records = []
        for trial in study.get_trials(deepcopy=False):
            if not trial.state.is_finished():
                records.append(TrialRecord.read(trial, attrs))
                continue
            source = (
                trial.datetime_start,
                trial.state,
                trial.values,
                len(trial.user_attrs),
                repr(attrs.get(confirmation_key(trial.number))),
            )
            kept = self._finished.get(trial.number)
            if kept is None or kept[0] != source:
                kept = self._finished[trial.number] = (source, TrialRecord.read(trial, attrs))
            records.append(kept[1])
        return whole(study, records)


def as_completed(trial: "optuna.Trial", value: float, write: Callable[[Any], None]) -> TrialRecord:
    """The record `trial` has once `write(trial)` has written its result and Optuna has stored
    `value`, made in memory from what the trial holds (no storage is read): what a search keeps
    of a measured trial in case its study cannot be written (`search.salvage`)."""
    frozen = FrozenTrial(
        number=trial.number,
        state=TrialState.COMPLETE,
        value=value,
        datetime_start=trial.datetime_start,
        datetime_complete=None,
        params=trial.params,
        distributions=trial.distributions,
        user_attrs=trial.user_attrs,
        system_attrs={},
        intermediate_values={},
        trial_id=-1,
    )
    write(frozen)  # a FrozenTrial takes user attrs and constraints as a trial does
    return TrialRecord.read(frozen)


# --- writing: what a trial's attrs say, in one place -----------------------------------------------


def write_result(trial: "optuna.Trial", outcome: Outcome, reason: str | None, measurement: Any, **timing: Any) -> None:
    """A trial that ran (or was reused): its outcome, reason, figures and timing."""
    trial.set_user_attr(OUTCOME, outcome)
    if reason:
        trial.set_user_attr(REASON, reason[:REASON_LIMIT])
    if measurement is not None:
        trial.set_user_attr(MEASUREMENT, measurement.to_dict())
        trial.set_user_attr(TOKENS_PER_SEC, measurement.tokens_per_sec)
        trial.set_user_attr(CI95, measurement.tokens_per_sec_ci95)
        trial.set_user_attr(JOULES, measurement.joules_per_token)
        trial.set_user_attr(PEAK, measurement.peak_memory_bytes)
    if timing.get("phase_s"):
        trial.set_user_attr(PHASE_S, timing["phase_s"])
        trial.set_user_attr(WALL_S, timing.get("wall_s"))


def write_skipped(trial: "optuna.Trial", reason: str, predicted_peak: int, basis: str, basis_trials: Any) -> None:
    """A configuration not run: the memory model predicts it over the limit."""
    trial.set_user_attr(OUTCOME, Outcome.PREDICTED_OVER_LIMIT)
    trial.set_user_attr(REASON, reason[:REASON_LIMIT])
    trial.set_user_attr(PREDICTED_PEAK, predicted_peak)
    trial.set_user_attr(MEMORY_BASIS, basis[:REASON_LIMIT])
    trial.set_user_attr(MEMORY_BASIS_TRIALS, list(basis_trials))


def write_stopped(trial: "optuna.Trial", outcome: Outcome, reason: str) -> None:
    """A trial that ended without figures (interrupted): its outcome and why."""
    trial.set_user_attr(OUTCOME, outcome)
    trial.set_user_attr(REASON, reason[:REASON_LIMIT])


def fail_left_running(
    storage: "optuna.storages.BaseStorage", study_id: int, number: int, outcome: Outcome, reason: str
) -> FrozenTrial | None:
    """A trial another process left RUNNING, failed with its outcome and why: written through the
    study's storage (`study.storage.internals`: Optuna has no public call for a trial of another
    process). None when it finished meanwhile."""
    import optuna

    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    try:
        storage.set_trial_user_attr(trial_id, OUTCOME, outcome)
        storage.set_trial_user_attr(trial_id, REASON, reason[:REASON_LIMIT])
        storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return None
    return storage.get_trial(trial_id)


def _over_bounds(constraints: Mapping[str, float]) -> str | None:
    """Why a run that ended ok breaks its study's bounds ("above --max-ttft by 35%"), or None."""
    over = [
        f"above {option} by {constraints[name]:.0%}"
        for name, option in BOUND_OPTIONS.items()
        if constraints.get(name, 0.0) > 0
    ]
    return "; ".join(over) or None


def _not_finite(figures: Mapping[str, Any]) -> str | None:
    """The figures among `figures` that are numbers but not finite ("tokens_per_sec nan"), or None."""
    bad = [f"{name} {value}" for name, value in figures.items() if _is_number(value) and not math.isfinite(value)]
    return ", ".join(bad) or None


def _number(value: Any) -> float | None:
    """A finite number as a float; None for anything else (a NaN or infinite figure is no figure)."""
    return float(value) if _is_number(value) and math.isfinite(value) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
