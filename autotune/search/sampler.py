"""The tuner's sampler: an Optuna sampler whose every proposal is the planner's (`search.planner`;
a generation study's, `search.generation_planner`),
so the study, its storage, optuna-dashboard and the workers sharing it work as with any sampler.

Before each trial it asks the planner for a whole configuration, reading every finished trial of
the study (`study.record`) and, when other workers share the study, the configurations they are
running (which it will not propose again: Optuna's "constant liar" for a model that is not TPE).
`sample_independent` then answers each parameter `sampling.suggest` asks for from that proposal.
A trial with fixed parameters (the references, a warm start, an enqueued one) is left as it is.
After each trial `stop_reason` says whether to stop (the planner's rule). benchmarks/ replay this
exact sampler (time_to_recipe.py's `tuner`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Union

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.search.planner import Planner, Proposal, Stop
from autotune.study.record import RecordCache
from autotune.study.references import REFERENCE_ATTR

if TYPE_CHECKING:
    from autotune.search.generation_planner import GenerationPlanner

# A task's planner: training's, or generation's (the same questions: propose, stop_reason, check).
AnyPlanner = Union[Planner, "GenerationPlanner"]

PLANNING_WAIT_S = 10.0  # a planner's first proposal lists the space: a second or two
PLANNING_POLL_S = 0.1
_pause = time.sleep  # a name of its own: tests count the waits instead of timing them


class PlannerSampler(optuna.samplers.BaseSampler):
    def __init__(self, planner: AnyPlanner | Callable[[], AnyPlanner], *, seed: int | None = None) -> None:
        self._planner = planner
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self.proposals: dict[int, Proposal] = {}
        self.stopped: str | None = None  # why the planner had nothing to propose, if it did not
        self.records = RecordCache()  # read before and after every trial: each finished one made once

    @property
    def planner(self) -> AnyPlanner:
        if not self._built:
            self._planner = self._planner()  # built when first needed: listing the space takes a moment
        return self._planner

    @property
    def _built(self) -> bool:
        return hasattr(self._planner, "propose")

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs or REFERENCE_ATTR in trial.user_attrs:
            return  # enqueued: the references, a warm start, a trial enqueued by hand
        records = self._once_others_planned(study, trial.number)
        running = [r.config for r in records if r.state is TrialState.RUNNING and r.config]
        result = self.planner.propose(records, running)
        if isinstance(result, Stop):
            self.stopped = result.reason
        else:
            self.proposals[trial.number] = result

    def _once_others_planned(self, study: optuna.Study, number: int) -> list[Any]:
        """The study's records once every trial begun before this one says what it runs: a worker
        proposing while another still plans would propose the same configuration (issue D, P03: two
        tuners started a second apart both ran the expert prior). Waits PLANNING_WAIT_S at most
        (a worker gone mid-plan), and never on a later trial, so two workers never wait on each other."""
        deadline = time.monotonic() + PLANNING_WAIT_S
        while True:
            records = [r for r in self.records.read(study) if r.number != number]
            planning = [r for r in records if r.state is TrialState.RUNNING and not r.config and r.number < number]
            if not planning or time.monotonic() > deadline:
                return records
            _pause(PLANNING_POLL_S)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        proposal = self.proposals.get(trial.number)
        if proposal is not None and param_name in proposal.params:
            value = proposal.params[param_name]
            try:
                if param_distribution._contains(param_distribution.to_internal_repr(value)):
                    return value
            except (ValueError, TypeError):
                pass
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def proposal_for(self, number: int) -> Proposal | None:
        return self.proposals.get(number)

    def doubt(self) -> str | None:
        """Why the last fit's "nothing left" could not be trusted, for a search that ended by its
        budget rather than settling; None if it could."""
        if not self._built or self._planner.check is None:
            return None
        check = self._planner.check
        if check.trusted:
            return None
        return f"not settled: {check.text()}, more than the noise; a longer search may find more"

    def stop_reason(self, study: optuna.Study) -> str | None:
        """Why the search should stop now (no trial is expected to gain more than the noise), or None."""
        if self.stopped is not None:
            return self.stopped
        records = self.records.read(study)
        running = [r.config for r in records if r.state is TrialState.RUNNING and r.config]
        return self.planner.stop_reason(records, running)


def planner_for(ctx: Any, seed: int | None = None) -> Planner:
    """The planner of a study (`search.training.TrainTask`): its space and device, its memory
    limit less the headroom, the model's shape where it is known; a candidate must keep the
    space's rules, run on this device, and divide the study's global batch."""
    from autotune.errors import UnsupportedConfig
    from autotune.knobs.support import check_supported
    from autotune.measure import outcomes
    from autotune.search.memory_model import memory_context

    caps = ctx.capabilities

    def valid(cfg: Any) -> bool:
        try:
            check_supported(cfg, caps)
            ctx.spec.accumulation_steps(cfg)
        except UnsupportedConfig:
            return False
        return True

    memory = memory_context(ctx)
    return Planner(
        ctx.space,
        device_kind=ctx.device.kind,
        compute_capability=ctx.device.capability_tuple,
        memory=memory,
        feasible_limit=outcomes.feasible_peak_bytes(ctx.memory_limit_bytes, ctx.memory_headroom),
        valid=valid,
        seed=seed or 0,
    )


def study_sampler(ctx: Any, seed: int | None = None) -> PlannerSampler:
    """The sampler `autotune search` gives a study: its planner, built when first asked."""
    return PlannerSampler(lambda: planner_for(ctx, seed), seed=seed)
