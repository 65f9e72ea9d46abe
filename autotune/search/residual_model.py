"""What the experts' linear model cannot express, learnt from the measurements, and how well the
whole model predicts the trials it has measured.

The throughput model (`throughput_model`) is a sum of per-knob effects in the log, with a few
interaction columns written by hand. Real landscapes have interactions nobody listed (an
autotuned compile that pays only as one whole-model graph; an attention kernel that breaks the
compiled graph; a host whose workers bind): there the sum is confidently wrong. So its residuals
get a Gaussian process of their own, over the configurations themselves:

    log tokens/s = linear(experts' priors, measured effects) + residual(config),
    residual ~ GP(0, tau^2 * exp(-knobs that differ / LENGTH)),

which corrects the prediction near what was measured and keeps `tau` of doubt about what was
not. `tau` is read from the data (empirical Bayes): at least the measurement noise, more when the
linear model mispredicts its own trials, so a landscape it cannot express makes the search look
further instead of settling.

The same fit answers the stop rule's question "do I know enough to stop?": each measured trial
predicted from all the others (leave-one-out, in closed form), its error against the predicted
spread. A model whose held-out errors exceed the noise has no business declaring that nothing
better is left. Torch-free; numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

LENGTH = 1.5  # knobs that differ at which the residuals of two configurations are e^-1 correlated
OUTLIER_Z = 4.0  # a held-out error this many predicted spreads off is a bad reading, not a landscape
OUTLIER_NOISE = 30.0  # ... and counts with this many times its noise: next to nothing, until measured again
TRUSTED_Z2 = 2.0  # the stop rule trusts a model whose mean squared held-out z is at most this ...
TRUSTED_NOISE = 2.0  # ... and that under-predicts its leaders by at most this many times the noise
MIN_TRIALS = 4  # fewer measured trials: too few to judge the model by
NEAR_BEST = 0.10  # trials within this of the best (log tokens/s) are the ones the self-check judges


class Codes:
    """Configurations as integer codes, one column per knob, for counting the knobs that differ."""

    def __init__(self, knobs: Sequence[str]) -> None:
        self.knobs = list(knobs)
        self.values: list[dict[Any, int]] = [{} for _ in self.knobs]

    def encode(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        out = np.zeros((len(configs), len(self.knobs)), dtype=np.int32)
        for j, (knob, seen) in enumerate(zip(self.knobs, self.values)):
            for i, config in enumerate(configs):
                value = config.get(knob)
                value = tuple(value) if isinstance(value, list) else value
                out[i, j] = seen.setdefault(value, len(seen))
        return out


def differing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b)) counts of the knobs that differ, a knob at a time (no (m, n, K) array)."""
    counts = np.zeros((a.shape[0], b.shape[0]), dtype=np.float64)
    for k in range(a.shape[1]):
        counts += a[:, k, None] != b[None, :, k]
    return counts


@dataclass
class Residual:
    """The GP over the linear model's residuals at the measured trials, and its self-check."""

    codes: np.ndarray  # (n, K) the measured configurations
    tau: float
    alpha: np.ndarray  # K^-1 (residuals), K = tau^2 C + noise^2
    k_inv: np.ndarray

    def predict(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of the residual at each configuration (latent: no measurement noise)."""
        if len(self.alpha) == 0:
            return np.zeros(len(codes)), np.full(len(codes), self.tau**2)
        cross = self.tau**2 * np.exp(-differing(codes, self.codes) / LENGTH)
        mean = cross @ self.alpha
        var = self.tau**2 - np.einsum("ij,jk,ik->i", cross, self.k_inv, cross, optimize=True)
        return mean, np.maximum(var, 1e-12)

    def held_out(self) -> tuple[np.ndarray, np.ndarray]:
        """Each trial's residual predicted from the others: (error, variance of the reading)."""
        diag = np.diag(self.k_inv)
        return self.alpha / diag, 1.0 / diag


def fit_residual(codes: np.ndarray, residuals: np.ndarray, noise_var: np.ndarray, tau: float) -> Residual:
    """The GP of `residuals` (with their noise variances) at amplitude `tau`."""
    if len(residuals) == 0:
        return Residual(codes, tau, np.zeros(0), np.zeros((0, 0)))
    gram = tau**2 * np.exp(-differing(codes, codes) / LENGTH) + np.diag(noise_var)
    k_inv = np.linalg.inv(gram)
    k_inv = (k_inv + k_inv.T) / 2
    return Residual(codes, tau, k_inv @ residuals, k_inv)


def amplitude(errors: np.ndarray, noise_var: np.ndarray, floor: float, *, robust: bool) -> float:
    """What the held-out errors' spread says beyond their noise (empirical Bayes), never below the
    floor. robust: from the median (0.455 is the median of a chi-square of one degree), so that
    one bad reading cannot widen the model enough to hide itself; else from the mean, so that a
    landscape the experts' sum cannot express widens it."""
    if len(errors) < MIN_TRIALS:
        return floor
    excess = np.square(errors) - noise_var
    spread = float(np.median(excess)) / 0.455 if robust else float(np.mean(excess))
    return max(floor, math.sqrt(max(spread, 0.0)))


def judge(
    codes: np.ndarray,
    errors: np.ndarray,
    variances: np.ndarray,
    floor: float,
    known_bad: tuple[int, ...] = (),
    leaders: np.ndarray | None = None,
) -> tuple["SelfCheck", float]:
    """How well the model predicts each measured trial from all the others, and the residual GP's
    amplitude. `errors`: the linear model's held-out errors, `variances`: theirs (noise included).
    `leaders`: the trials the judgement is about (those near the best: whether something beats
    the best depends on the model being right there, not about configurations far below it).

    A reading far *below* what the others predict (OUTLIER_Z spreads, at a robust amplitude) is a
    bad reading: interference only ever slows a run (throttling, a noisy neighbour, a stall), and
    a surprise on the fast side is what a landscape with an unlisted interaction looks like, which
    the model must learn, not discount. Bad readings leave the amplitude and the judgement."""
    if len(errors) == 0:
        return SelfCheck(0, 0.0, 0.0, (), floor), floor
    robust = fit_residual(codes, errors, variances, amplitude(errors, variances, floor, robust=True))
    held_error, held_var = robust.held_out()
    bad = (held_error / np.sqrt(held_var) < -OUTLIER_Z) if len(errors) >= MIN_TRIALS else np.zeros(len(errors), bool)
    bad[list(known_bad)] = True
    keep = ~bad
    tau = amplitude(errors[keep], variances[keep], floor, robust=False)
    judged = fit_residual(codes[keep], errors[keep], variances[keep], tau)
    held_error, held_var = judged.held_out()
    outliers = tuple(int(i) for i in np.flatnonzero(bad))
    about = (leaders if leaders is not None else np.ones(len(errors), bool))[keep]
    if about.sum() < MIN_TRIALS:  # too few near the best to judge by: judge by them all
        about = np.ones(len(held_error), bool)
    return self_check(held_error[about], held_var[about], outliers, n=int(about.sum()), noise=floor), tau


def linear_held_out(X: np.ndarray, y: np.ndarray, noise_var: np.ndarray, mean: np.ndarray, cov: np.ndarray):
    """The Bayesian linear model's prediction of each trial without it (exact, by a rank-one
    downdate): its error and the variance of the latent prediction. A trial the linear model
    fits only because it saw it (high leverage) shows its real error here."""
    fitted = X @ mean
    latent = np.einsum("ij,jk,ik->i", X, cov, X, optimize=True)
    leverage = np.minimum(latent / noise_var, 1 - 1e-9)
    return (y - fitted) / (1 - leverage), latent / (1 - leverage)


@dataclass(frozen=True)
class SelfCheck:
    """How well the model predicts its own measured trials, each from all the others."""

    n: int
    mean_z2: float  # mean squared held-out error over its predicted variance (about 1 if right)
    rms_error: float  # of log tokens/s: a relative error
    outliers: tuple[int, ...]  # indices (in the measured order) of readings far off the rest
    noise: float = 0.0  # the spread of one measurement, which the errors are judged against
    under: float = 0.0  # rms of the held-out errors where a trial ran faster than predicted

    @property
    def trusted(self) -> bool:
        """Its leading trials predicted within their spread, and none of them much faster than
        the others predicted: a model that under-predicts what it measured near the best (only
        its widened amplitude explaining the errors) would under-predict what it did not measure
        there too, which is how a search settles below the best. Over-prediction is harmless
        here: it only makes the search look further."""
        if self.n < MIN_TRIALS:
            return True
        return self.mean_z2 <= TRUSTED_Z2 and self.under <= TRUSTED_NOISE * self.noise

    def text(self) -> str:
        if self.n < MIN_TRIALS:
            return f"too few trials ({self.n}) to check the model against"
        return (
            f"the model predicts each of its {self.n} leading trials from the others within "
            f"{100 * self.rms_error:.1f} %, under-predicting them by {100 * self.under:.1f} % "
            f"(noise {100 * self.noise:.1f} %)"
        )


def self_check(
    errors: np.ndarray, variances: np.ndarray, outliers: tuple[int, ...], *, n: int, noise: float
) -> SelfCheck:
    """The check over the trials judged (`errors`, `variances`: each held out), `n` trials in all."""
    if len(errors) == 0:
        return SelfCheck(n, 0.0, 0.0, outliers, noise)
    return SelfCheck(
        n,
        float(np.mean(np.square(errors) / variances)),
        float(np.sqrt(np.mean(np.square(errors)))),
        outliers,
        noise,
        float(np.sqrt(np.mean(np.square(np.maximum(errors, 0.0))))),
    )


def fit_rates(rows, y, noise, codes, prior_mean, prior_sd, floor: float) -> tuple[Any, Residual, SelfCheck]:
    """Both planners' model of log tokens/s at the measured trials: the experts' linear posterior
    (`throughput_model`), the GP of its residuals, and how well the two predict each trial from
    the others (`judge`). A reading the check calls bad is fitted again with OUTLIER_NOISE times
    its noise: it moves nothing for good until measured again."""
    posterior, residual, check = _fit_rates(rows, y, noise, codes, prior_mean, prior_sd, floor)
    if check.outliers:
        noise = noise.copy()
        noise[list(check.outliers)] *= OUTLIER_NOISE
        posterior, residual, check = _fit_rates(rows, y, noise, codes, prior_mean, prior_sd, floor, check.outliers)
    return posterior, residual, check


def _fit_rates(rows, y, noise, codes, prior_mean, prior_sd, floor, known_bad: tuple[int, ...] = ()):
    from autotune.search.throughput_model import fit_throughput

    posterior = fit_throughput(rows, y, noise, prior_mean, prior_sd)
    noise_var = np.square(noise)
    errors, latent_var = linear_held_out(rows, y, noise_var, posterior.mean, posterior.cov)
    leaders = y >= y.max() - NEAR_BEST if len(y) else np.zeros(0, bool)
    check, tau = judge(codes, errors, latent_var + noise_var, floor, known_bad, leaders)
    residual = fit_residual(codes, y - rows @ posterior.mean, noise_var, tau)
    return posterior, residual, check


def corrected(
    mean: np.ndarray, var: np.ndarray, codes: np.ndarray, residual: Residual, near: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The linear model's (mean, variance) at every candidate with the residual's doubt added
    everywhere, and, at the candidates `near` (those worth the cost), the GP's correction."""
    mean, var = mean.copy(), var + residual.tau**2
    if len(residual.alpha) and near.any():
        correction, residual_var = residual.predict(codes[near])
        mean[near] += correction
        var[near] += residual_var - residual.tau**2
    return mean, var
