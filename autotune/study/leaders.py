"""The leaders of a study and how the winner is chosen among them, and what a study maximizes.
Torch-free: a study is read through it (the tuner re-measures the leaders: `search.confirm`).

The best of many noisy trials is biased upward (the winner's curse; Optuna #433, #2021): the
trial that measured highest is often a configuration that got a lucky run, when the next one
is as fast or faster. So, at the end of a search:

- the leaders are the top 3 distinct configurations by the study's objective (feasible, ok);
- when the best's 95 % interval overlaps the next leaders' (they cannot be told apart on one
  run each; an unknown interval overlaps everything), each leader is measured once more in a
  fresh process; otherwise only the best is (a second run for its figures);
- then, while the best trial not re-measured ran (once) above the winner's mean, it is
  re-measured too (at most LEADERS more): a fourth trial as lucky as the leaders were would
  otherwise stand above the choice in every list of figures;
- then, while the two best means are closer than the noise lets two runs each tell apart, both
  are measured again, up to READINGS runs each (`tied`; tokens/s only, and only where that many
  runs can resolve a 3 % difference: a GPU's spread, not a CPU's). Replayed on the benchmarks'
  whole table, 17 more runs of 720 recommended within 3 % of the best, for 7.8 % more seconds;
- the winner is the leader with the best mean over its runs, among those re-measured with a
  result (a re-measurement that ended otherwise than ok, e.g. out of memory, drops its leader
  when another one reproduced). Until the best is re-measured (a search stopped before), the
  winner is the best single run, as before.

`tests/search/test_confirm_replay.py` replays the rule on constructed noisy figures: it picks
the truly best configuration more often than the best single run does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from autotune.measure import outcomes
from autotune.measure.intervals import overlap
from autotune.study.record import confirmation_key  # noqa: F401  (re-exported: where leaders are read)

if TYPE_CHECKING:
    from autotune.study.record import TrialRecord

LEADERS = 3
# Near-tied leaders are measured again up to this many runs each (`tied`), where that can tell a
# TOLERANCE difference apart: on a GPU's 1.5 % spread, 4 runs each resolve about 2 %.
READINGS = 4
TOLERANCE = 0.03  # the difference the recipe is meant to get right (the benchmarks' "within 3 %")
# What a study maximizes: tokens/s (the default), or tokens per joule (energy per token,
# `measure.energy`), under the same memory constraint.
OBJECTIVES = ("tokens_per_sec", "tokens_per_joule")
DEFAULT_OBJECTIVE = "tokens_per_sec"


def objective_value(figures: Mapping[str, Any] | None, objective: str) -> float | None:
    """The objective's value of a measurement (its dict, or a confirmation's record)."""
    if not figures:
        return None
    if objective == "tokens_per_joule":
        joules = figures.get("joules_per_token")
        return 1.0 / joules if joules else None
    return figures.get("tokens_per_sec")


def objective_interval(figures: Mapping[str, Any] | None, objective: str) -> tuple[float, float] | None:
    """The 95 % interval of the objective's value, where the run has one: tokens/s only (energy
    is one reading over the window, with no spread of its own)."""
    if not figures or objective != "tokens_per_sec" or not figures.get("tokens_per_sec_ci95"):
        return None
    low, high = figures["tokens_per_sec_ci95"]
    return float(low), float(high)


@dataclass(frozen=True)
class Candidate:
    """A configuration among the leaders: its trial's run and, once re-measured, the second."""

    number: int  # the trial
    value: float  # the objective's value of the trial's run
    interval: tuple[float, float] | None = None  # its 95 % interval; None: unknown
    remeasured: bool = False  # measured once more in a fresh process (whatever the outcome)
    second: float | None = None  # the objective's value of that run; None: it ended otherwise than ok
    again: tuple[float, ...] = ()  # further runs' values, taken to tell it from a near-tie (`tied`)

    @property
    def values(self) -> tuple[float, ...]:
        return (self.value,) if self.second is None else (self.value, self.second, *self.again)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)


def leaders(ranked: Sequence[Candidate], configs: Sequence[str] | None = None, n: int = LEADERS) -> list[Candidate]:
    """The top `n` distinct configurations of candidates ranked best first (`configs[i]`
    identifies candidate i's configuration; a configuration run twice counts once)."""
    chosen, seen = [], set()
    for i, candidate in enumerate(ranked):
        key = configs[i] if configs is not None else candidate.number
        if key in seen:
            continue
        seen.add(key)
        chosen.append(candidate)
        if len(chosen) == n:
            break
    return chosen


def to_remeasure(top: Sequence[Candidate]) -> list[Candidate]:
    """All the leaders when the best's interval overlaps another leader's, else the best only."""
    if not top:
        return []
    best, rest = top[0], top[1:]
    return list(top) if any(overlap(best.interval, c.interval) for c in rest) else [best]


def tied(top: Sequence[Candidate], noise: float) -> list[Candidate]:
    """The two best leaders by mean (re-measured with a result) while they cannot be told apart
    and more readings could: their means closer than twice the spread of their difference
    (`noise`: one reading's spread of log tokens/s), each with fewer than READINGS runs; those
    of the two still under READINGS. Empty where the spread is too wide for READINGS runs to
    resolve a TOLERANCE difference (a CPU's 6 %): there more runs would only cost."""
    if 2 * noise * math.sqrt(2 / READINGS) >= TOLERANCE:
        return []
    reproduced = sorted((c for c in top if c.remeasured and c.second is not None), key=lambda c: -c.mean)
    if len(reproduced) < 2:
        return []
    a, b = reproduced[:2]
    if math.log(a.mean / b.mean) >= 2 * noise * math.sqrt(1 / len(a.values) + 1 / len(b.values)):
        return []
    return [c for c in (a, b) if len(c.values) < READINGS]


def winner(top: Sequence[Candidate]) -> Candidate | None:
    """The leader with the best mean among those re-measured with a result; the best single
    run while the best has not been re-measured, or when no re-measurement gave a result."""
    if not top:
        return None
    if not top[0].remeasured:
        return top[0]
    reproduced = [c for c in top if c.remeasured and c.second is not None]
    return max(reproduced, key=lambda c: c.mean) if reproduced else top[0]


# --- a study's leaders --------------------------------------------------------------------------


def study_leaders(feasible: Iterable["TrialRecord"], objective: str) -> list[Candidate]:
    """The leaders among a study's feasible trials by the study's objective, with their
    re-measurements: the top LEADERS distinct configurations, then every other trial re-measured
    (a challenger the confirmation went on to, `challenger`)."""
    ranked = sorted(feasible, key=lambda r: r.value or 0.0, reverse=True)
    configs = [json.dumps(r.config or {}, sort_keys=True) for r in ranked]
    candidates = [_candidate(r, objective) for r in ranked]
    top = leaders(candidates, configs)
    chosen = {c.number for c in top}
    return top + [c for c in candidates if c.remeasured and c.number not in chosen]


def challenger(feasible: Sequence["TrialRecord"], objective: str) -> Candidate | None:
    """Once the winner is re-measured, the best trial not re-measured (of a configuration none
    was) whose one run is above the winner's mean, or None. The leaders' second runs came in
    lower (the winner's curse): a trial just outside them, as lucky once, would stand above the
    choice in every list of figures. It is measured again too, so that the choice is made among
    figures alike."""
    top = study_leaders(feasible, objective)
    best = winner(top)
    if best is None or not best.remeasured:
        return None
    by_number = {r.number: r for r in feasible}
    measured_configs = {json.dumps(by_number[c.number].config or {}, sort_keys=True) for c in top if c.remeasured}
    for r in sorted(feasible, key=lambda r: r.value or 0.0, reverse=True):
        candidate = _candidate(r, objective)
        if candidate.remeasured or json.dumps(r.config or {}, sort_keys=True) in measured_configs:
            continue
        return candidate if candidate.value > best.mean else None
    return None


def _candidate(record: "TrialRecord", objective: str) -> Candidate:
    confirmation = record.confirmation
    second, again = None, ()
    if confirmation is not None and confirmation.outcome is outcomes.OK:
        second = objective_value(confirmation.to_dict(), objective)
        if objective == DEFAULT_OBJECTIVE:  # further runs read tokens/s only
            again = confirmation.again
    measurement = record.measurement.to_dict() if record.measurement else None
    return Candidate(
        number=record.number,
        value=float(record.value or 0.0),
        interval=objective_interval(measurement, objective),
        remeasured=confirmation is not None,
        second=second,
        again=again if second is not None else (),
    )
