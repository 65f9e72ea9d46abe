"""When to stop a search: `search --until-converged` stops once no trial in the last K has
improved the best feasible tokens/s by more than the measurement noise; and why a search
stopped, for its summary.

K and the noise come from the study itself:

- **noise**: the relative spread of one trial's figure. Each trial measures its per-step
  spread (`step_time_cv`: the coefficient of variation of the step time per modelled FLOP);
  the median over the study's measured trials is the noise, or the spread between a trial and
  its confirmation run (a second measurement of the same configuration in a fresh process)
  where that is larger. The per-step CV is used as it is, not divided by the square root of
  the step count: what separates two trials is run-to-run spread (process placement, clocks,
  other tenants), which on this project's CPU VM is 6-12 % (benchmarks/fidelity.py) against a
  median per-step CV of 12 % (benchmarks/data/cpu_gpt2_tiny_sweep.json), far above the
  standard error of a window's mean. Held within [1 %, 10 %]: below 1 % no two runs of one
  configuration agree (the recipe's own reproduction check allows 3 %); above 10 % the trials
  are flagged unstable, and one of them must not freeze the search.
- **K = max(10, 2 x the space's dimensions)**: TPE spends its first 5 trials at random
  (`study.make_sampler`); 10 is twice that, so the rule never fires on the random phase alone.
  In a space of d knobs, 2d trials give TPE room to move each knob off the incumbent about
  twice (once each way) before the search is called done: 22 trials in the CPU space,
  26 in the CUDA space.

Pure and torch-free: the sweep replay (benchmarks/) calls `ConvergenceRule` on recorded
sequences; the search calls it through `StopWhenConverged`, an Optuna callback."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.space.definition import SearchSpace
from autotune.study.record import TrialRecord

log = logging.getLogger(__name__)

MIN_NOISE, MAX_NOISE = 0.01, 0.10
MIN_PATIENCE = 10  # twice TPE's random start-up trials
PATIENCE_PER_DIMENSION = 2
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


@dataclass(frozen=True)
class ConvergenceRule:
    """Converged: a feasible value exists, and none of the last `patience` finished trials
    beat the best before it by more than `noise` (relative)."""

    patience: int
    noise: float

    def trials_since_improvement(self, values: Sequence[float | None]) -> int | None:
        """Finished trials since the last one that improved the best by more than the noise
        (the first feasible one counts as an improvement); None before any feasible value.
        `values`: each finished trial's feasible value, None for one with none, in the order
        the trials finished."""
        best: float | None = None
        last: int | None = None
        for i, value in enumerate(values):
            if value is None:
                continue
            if best is None or value > best * (1 + self.noise):
                last = i
            if best is None or value > best:
                best = value  # a gain within the noise still moves the best, not the clock
        return None if last is None else len(values) - 1 - last

    def converged(self, values: Sequence[float | None]) -> bool:
        since = self.trials_since_improvement(values)
        return since is not None and since >= self.patience

    def describe(self) -> str:
        return (
            f"no trial in the last {self.patience} improved the best feasible tokens/s by more than "
            f"{100 * self.noise:.1f} % (the measurement noise)"
        )


def patience_for(n_dimensions: int) -> int:
    return max(MIN_PATIENCE, PATIENCE_PER_DIMENSION * n_dimensions)


def space_dimensions(space: SearchSpace) -> int:
    """The knobs a space searches: its dimensions, and the checkpointed blocks as a count and,
    where a partial count and more than one placement are offered, a placement."""
    n = len(space.dimensions)
    checkpoint = space.checkpoint
    if checkpoint is not None:
        count, depth = checkpoint.count, space.n_layer
        if count.choices is not None:
            partial = any(0 < c < (depth or c + 1) for c in count.choices)
        else:
            partial = (depth or 2) > 1 and count.high != count.low
        n += 1 + (partial and len(checkpoint.placements) > 1)
    return n


def measurement_noise(trials: Iterable[FrozenTrial], repeats: Iterable[tuple[float, float]] = ()) -> float:
    """The study's relative noise: the median per-step CV of its measured trials, or the median
    relative spread of repeated measurements (`repeats`: pairs of tokens/s of one configuration)
    where larger; within [MIN_NOISE, MAX_NOISE]. MIN_NOISE without any figure."""
    cvs = [cv for cv in (_step_time_cv(t) for t in trials) if cv is not None]
    spreads = [abs(a - b) / ((a + b) / 2) for a, b in repeats if a and b]
    estimate = max(statistics.median(cvs) if cvs else 0.0, statistics.median(spreads) if spreads else 0.0)
    return min(MAX_NOISE, max(MIN_NOISE, estimate))


def feasible_values(trials: Iterable[FrozenTrial]) -> list[float | None]:
    """Each finished trial's feasible tokens/s (None for any other), in the order they finished."""
    done = sorted(
        (t for t in trials if t.state in FINISHED),
        key=lambda t: (t.datetime_complete is None, t.datetime_complete or 0, t.number),
    )
    return [float(t.value) if TrialRecord.read(t).feasible else None for t in done]


def rule_for(
    trials: Sequence[FrozenTrial], n_dimensions: int, repeats: Iterable[tuple[float, float]] = ()
) -> ConvergenceRule:
    """The rule of a study, from its own figures."""
    return ConvergenceRule(patience_for(n_dimensions), measurement_noise(trials, repeats))


def confirmation_repeats(study_attrs: dict[str, Any], trials: Sequence[FrozenTrial]) -> list[tuple[float, float]]:
    """(trial, confirmation) tokens/s pairs: the search's confirmation runs of its best trials."""
    by_number = {t.number: t for t in trials}
    pairs = []
    for key, value in study_attrs.items():
        if not key.startswith("confirmation:") or not isinstance(value, dict):
            continue
        trial = by_number.get(int(key.split(":", 1)[1])) if key.split(":", 1)[1].isdigit() else None
        first, again = trial and trial.user_attrs.get("tokens_per_sec"), value.get("tokens_per_sec")
        if first and again:
            pairs.append((float(first), float(again)))
    return pairs


def _step_time_cv(trial: FrozenTrial) -> float | None:
    if not TrialRecord.read(trial).feasible or "duplicate_of" in trial.user_attrs:
        return None
    cv = (trial.user_attrs.get("measurement") or {}).get("step_time_cv")
    return float(cv) if isinstance(cv, (int, float)) else None


@dataclass
class StopWhenConverged:
    """An Optuna callback: after each trial, the study's rule on all its trials (every worker's);
    `study.stop()` once it holds. `fired` is the rule that stopped it, with the trial count."""

    n_dimensions: int
    fired: ConvergenceRule | None = None
    trials_seen: int = 0

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self.check(study) is not None:
            log.info("converged after %d finished trials: %s", self.trials_seen, self.fired.describe())
            study.stop()

    def check(self, study: optuna.Study) -> ConvergenceRule | None:
        """The study's rule when it holds now (and remembered in `fired`), else None. The sweep
        replay (benchmarks/time_to_recipe.py) asks this after each replayed trial."""
        trials = study.get_trials(deepcopy=False)
        rule = rule_for(trials, self.n_dimensions, confirmation_repeats(study.user_attrs, trials))
        values = feasible_values(trials)
        if not rule.converged(values):
            return None
        self.fired, self.trials_seen = rule, len(values)
        return rule


# --- why a search stopped ------------------------------------------------------------------------

N_TRIALS, TIMEOUT, CONVERGED, INTERRUPTED = "n_trials", "timeout", "converged", "interrupted"


@dataclass(frozen=True)
class SearchStop:
    """Why a search stopped: `reason` one of N_TRIALS, TIMEOUT, CONVERGED, INTERRUPTED; `text`
    one line for people; the rule's figures when it converged."""

    reason: str
    text: str
    patience: int | None = None
    noise: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason, "text": self.text}
        if self.reason == CONVERGED:
            out |= {"patience": self.patience, "noise": self.noise}
        return out


def converged_stop(rule: ConvergenceRule) -> SearchStop:
    return SearchStop(CONVERGED, f"converged: {rule.describe()}", rule.patience, rule.noise)


def budget_stop(*, ran: int, n_trials: int | None, timeout_s: float | None) -> SearchStop:
    """n-trials reached, or the timeout: what ended a search that neither converged nor was stopped."""
    if n_trials is not None and ran >= n_trials:
        return SearchStop(N_TRIALS, f"--n-trials reached ({ran} trial{'s' if ran != 1 else ''} run)")
    if timeout_s is not None:
        return SearchStop(TIMEOUT, f"--timeout reached ({timeout_s:g} s; {ran} trial{'s' if ran != 1 else ''} run)")
    return SearchStop(N_TRIALS, f"{ran} trial{'s' if ran != 1 else ''} run")


def interrupted_stop(signal_name: str) -> SearchStop:
    how = "Ctrl-C" if signal_name == "SIGINT" else signal_name
    return SearchStop(INTERRUPTED, f"stopped by {how}")
