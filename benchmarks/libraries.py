"""The libraries issue A names as candidates for the tuner's model, replayed on the same
landscapes as the planner (`time_to_recipe.py` / `landscape_table.py --strategies smac botorch`):

  smac        SMAC3 as shipped (`HyperparameterOptimizationFacade`, ask and tell): its random forest
              with log-scaled costs, its expected improvement and local search; one categorical per
              knob; an initial design of 5 Sobol configurations (as TPE's 5 start-up trials)
              and the experts' (the planner's first proposal: its priors of throughput and
              memory), which SMAC runs after its own (it appends additional configurations);
              a configuration over the memory limit, out of memory, refused or
              failed is a crash (SMAC's way of saying "not this"; it has no constraint).
  gp-experts  Optuna's GPSampler given the experts' configuration as its start-up, instead of its
              10 random trials (the issue's suggestion; `gp` in time_to_recipe.py is GPSampler alone).
  botorch     BoTorch's mixed GP (`MixedSingleTaskGP`: a categorical Hamming kernel on every knob)
              over the residuals of the experts' linear model (the planner's prior mean, the mean
              the issue asks for), a second one on the log peaks for the chance to fit, and expected
              improvement x that chance over every candidate the planner lists; the experts'
              configuration first.

None has a stop rule: a run goes to the target (or the trial cap), and the table compares its
trials and seconds to 3 % with the planner's. SMAC3 and BoTorch are not dependencies of autotune:
`pip install smac botorch` (both bring scikit-learn, BoTorch brings gpytorch; torch is already
there). Each strategy is a `propose` hook (`_replay.py`): what it asks for is enqueued and the
replay runs it as it runs any trial; a combination the registry refuses is pruned at no cost."""

from __future__ import annotations

import math
import random
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

import _common  # noqa: F401  (puts the checkout on sys.path)
import numpy as np
import optuna
from _replay import History, Strategy, Sweep

from autotune.measure import outcomes
from autotune.search import priors
from autotune.search.planner import Proposal

START = 5  # configurations before a library's model proposes (TPE's start-up here: 5)
# SMAC's cost of a crash, in seconds per million tokens (1 token/s): worse than any run, and finite
# (its default, infinity, turns into NaN in the log-scaled costs its forest fits)
CRASH_COST = 1e6


@dataclass(frozen=True)
class Seen:
    """One finished trial of the replayed study, as a library is told it."""

    key: str | None  # None: a combination the registry refused (no configuration)
    tokens_per_sec: float | None  # the reading (noise included) where it ran and fit
    peak: int | None  # its measured peak, where one was measured
    oom: bool  # ran out of memory (no peak measured)


def seen_trials(study: optuna.Study, limit: int) -> list[Seen]:
    out = []
    for t in study.trials:
        if not t.state.is_finished():
            continue
        a = t.user_attrs
        fits = a.get("outcome") == outcomes.OK and (a.get("peak_memory_bytes") or 0) <= limit
        reading = a.get("tokens_per_sec") if fits else None
        out.append(Seen(a.get("config_key"), reading, a.get("peak_memory_bytes"), a.get("outcome") == outcomes.OOM))
    return out


def _per_run(make: Callable[[Sweep, History], Any]) -> Callable[[Sweep], Callable[[History], dict | None]]:
    """A propose hook that keeps one library object per replayed run (a new History: a new run)."""

    def hook(sweep: Sweep) -> Callable[[History], dict | None]:
        state: dict[str, Any] = {"history": None, "run": None}

        def propose(history: History) -> dict | None:
            if state["history"] is not history:
                state["history"], state["run"] = history, make(sweep, history)
            return state["run"].next()

        return propose

    return hook


def _planner(sweep: Sweep, limit: int):
    import time_to_recipe  # the planner the tuner would build for this sweep and limit

    return time_to_recipe.sweep_planner(sweep, limit)


def _experts_first(sweep: Sweep, limit: int) -> dict[str, Any] | None:
    """The params of the planner's first proposal, before any trial: what the experts' priors
    (throughput and memory) run first, as a library's first configuration."""
    proposal = _planner(sweep, limit).propose([])
    return proposal.params if isinstance(proposal, Proposal) else None


# --- SMAC3 ----------------------------------------------------------------------------------------


class _Smac:
    def __init__(self, sweep: Sweep, history: History) -> None:
        from ConfigSpace import Categorical, Configuration, ConfigurationSpace
        from smac import HyperparameterOptimizationFacade as HPO
        from smac import Scenario

        self.history = history
        names = sorted({k for r in sweep.records for k in r["params"]})
        values = {n: sorted({repr(r["params"][n]) for r in sweep.records if n in r["params"]}) for n in names}
        self.decode = {n: {v: eval(v) for v in vs} for n, vs in values.items()}  # noqa: S307 - our own reprs
        cs = ConfigurationSpace(seed=history.seed)
        cs.add([Categorical(n, vs) for n, vs in values.items()])
        scenario = Scenario(
            cs,
            deterministic=True,
            n_trials=100_000,
            seed=history.seed,
            crash_cost=CRASH_COST,
            output_directory=tempfile.mkdtemp(),
        )
        first = _experts_first(sweep, history.limit)
        extra = []
        if first is not None:
            full = {n: repr(first.get(n, eval(values[n][0]))) for n in names}  # noqa: S307
            extra = [Configuration(cs, values=full)]
        design = HPO.get_initial_design(scenario, n_configs=START, additional_configs=extra)
        self.smac = HPO(scenario, _never_called, initial_design=design, overwrite=True, logging_level=40)
        self.asked = None

    def next(self) -> dict[str, Any]:
        from smac.runhistory.dataclasses import TrialValue
        from smac.runhistory.enumerations import StatusType

        if self.asked is not None:  # what the last ask's trial gave
            last = seen_trials(self.history.study, self.history.limit)[-1]
            if last.tokens_per_sec:
                self.smac.tell(self.asked, TrialValue(cost=1e6 / last.tokens_per_sec))  # seconds per 1M tokens
            else:
                self.smac.tell(self.asked, TrialValue(cost=CRASH_COST, status=StatusType.CRASHED))
        self.asked = self.smac.ask()
        return {n: self.decode[n][v] for n, v in dict(self.asked.config).items()}


def _never_called(config: Any, seed: int = 0) -> float:
    raise AssertionError("the replay runs the trials; SMAC only asks and is told")


# --- BoTorch --------------------------------------------------------------------------------------


class _Botorch:
    def __init__(self, sweep: Sweep, history: History) -> None:
        import torch

        torch.set_num_threads(1)  # tiny matrices: threads only wait for each other on 2 cores
        self.sweep, self.history, self.limit = sweep, history, history.limit
        planner = _planner(sweep, history.limit)
        from _common import config_key

        self.params = planner.params
        self.keys = [config_key(c) for c in planner.configs]
        self.index = {k: i for i, k in enumerate(self.keys)}
        prior_mean, _ = planner.columns.throughput_prior(priors.LOADER_SD_UNKNOWN)
        self.prior = planner.X @ prior_mean  # the experts' log tokens/s of every candidate
        self.codes = torch.tensor(planner.C, dtype=torch.float64)
        self.rng = random.Random(history.seed)

    def next(self) -> dict[str, Any]:
        seen = [s for s in seen_trials(self.history.study, self.limit) if s.key in self.index]
        tried = {self.index[s.key] for s in seen}
        if not seen and (first := _experts_first(self.sweep, self.limit)) is not None:
            return first
        ran = [s for s in seen if s.tokens_per_sec]
        if len(ran) < 2 or len(seen) < START:  # too few readings to fit a GP: random start-up
            return self.params[self.rng.choice([i for i in range(len(self.params)) if i not in tried])]
        rows = [self.index[s.key] for s in ran]
        y = np.log([s.tokens_per_sec for s in ran]) - self.prior[rows]
        mean, sd = self._gp(rows, y)
        mean = mean + self.prior
        best = max(math.log(s.tokens_per_sec) for s in ran)
        z = (mean - best) / sd
        from scipy.stats import norm

        ei = sd * (z * norm.cdf(z) + norm.pdf(z))
        score = ei * self._p_fit(seen)
        score[list(tried)] = -1.0
        return self.params[int(np.argmax(score))]

    def _gp(self, rows: list[int], y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import MixedSingleTaskGP
        from gpytorch.mlls import ExactMarginalLogLikelihood

        X = self.codes[rows]
        model = MixedSingleTaskGP(X, torch.tensor(y).unsqueeze(-1), cat_dims=list(range(X.shape[1])))
        try:
            fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        except Exception:  # noqa: BLE001 - a fit that fails keeps the kernel's defaults, as a user's loop would
            pass
        means, sds = [], []
        with torch.no_grad():  # in chunks: the Hamming kernel of every candidate at once is (n, n, knobs)
            for chunk in torch.split(self.codes, 256):
                post = model.posterior(chunk)
                means.append(post.mean.squeeze(-1))
                sds.append(post.variance.clamp_min(1e-12).sqrt().squeeze(-1))
        return torch.cat(means).numpy(), torch.cat(sds).numpy()

    def _p_fit(self, seen: list[Seen]) -> np.ndarray:
        """Each candidate's chance to fit, from a GP on the log peaks measured (1 until two were);
        an out-of-memory run counts as a peak a quarter over the limit."""
        peaks = [(self.index[s.key], s.peak or 1.25 * self.limit) for s in seen if s.peak or s.oom]
        if len(peaks) < 2:
            return np.ones(len(self.params))
        from scipy.stats import norm

        rows, p = zip(*peaks)
        mean, sd = self._gp(list(rows), np.log(np.array(p, dtype=float)))
        return norm.cdf((math.log(self.limit) - mean) / sd)


# --- Optuna's GPSampler, the experts' configuration first ------------------------------------------


def _experts_start(sweep: Sweep) -> Callable[[History], dict | None]:
    """A propose hook: the experts' configuration as a run's first trial, the sampler's after."""

    def propose(history: History) -> dict | None:
        return _experts_first(sweep, history.limit) if not history.steps else None

    return propose


def gp_after_experts(seed: int) -> optuna.samplers.BaseSampler:
    """GPSampler with the experts' trial instead of its 10 random start-up trials: its GP (Matern
    kernel, categorical Hamming distances, constrained logEI on the recorded memory constraint)
    from the first completed trial."""
    import torch

    torch.set_num_threads(1)
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=1, warn_independent_sampling=False)


def strategies(sweep: Sweep) -> list[Strategy]:
    random_ = lambda seed: optuna.samplers.RandomSampler(seed=seed)  # noqa: E731 - fills what a hook leaves out
    return [
        Strategy("smac", random_, propose=_per_run(_Smac)(sweep), about="SMAC3's HPO facade, ask and tell"),
        Strategy("botorch", random_, propose=_per_run(_Botorch)(sweep), about="BoTorch mixed GP on the experts' mean"),
        Strategy(
            "gp-experts", gp_after_experts, propose=_experts_start(sweep), about="GPSampler, the experts' trial first"
        ),
    ]
