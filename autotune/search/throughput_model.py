"""Log tokens/s of any configuration, predicted from every measured trial: a Bayesian linear model
over `search.features`' columns, whose prior is what experts know (`search.priors`). With no
measurement it ranks configurations as the priors do; each measurement moves the effects of the
knob values it ran, and through them every configuration that shares those values. The
posterior gives each prediction a mean and an sd, from which the planner reads expected gains.

Why a linear model in the log: throughput is a product of factors (precision, kernels, compile,
padding, the batch's saturation, checkpointing's recompute), so their logs add; the few pairs that
interact have columns of their own. Torch-free, numpy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Posterior:
    mean: np.ndarray  # (F,)
    cov: np.ndarray  # (F, F)

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sd of the latent value of each row (no measurement noise)."""
        mu = X @ self.mean
        var = np.einsum("ij,jk,ik->i", X, self.cov, X, optimize=True)
        return mu, np.sqrt(np.maximum(var, 1e-12))


def bayesian_linear(
    X: np.ndarray, y: np.ndarray, noise_sd: np.ndarray, prior_mean: np.ndarray, prior_sd: np.ndarray
) -> Posterior:
    """The Gaussian posterior of theta for y = X theta + e, e ~ N(0, noise_sd^2), theta ~ N(m0, diag(s0^2))."""
    precision0 = 1.0 / np.square(prior_sd)
    if len(y) == 0:
        return Posterior(prior_mean.copy(), np.diag(1.0 / precision0))
    w = 1.0 / np.square(noise_sd)
    A = np.diag(precision0) + (X.T * w) @ X
    b = precision0 * prior_mean + X.T @ (w * y)
    cov = np.linalg.inv(A)
    cov = (cov + cov.T) / 2
    return Posterior(cov @ b, cov)


def fit_throughput(
    X: np.ndarray, log_tps: np.ndarray, noise_sd: np.ndarray, prior_mean: np.ndarray, prior_sd: np.ndarray
) -> Posterior:
    """The throughput model's posterior from measured trials (rows of `X`, their log tokens/s)."""
    return bayesian_linear(X, log_tps, noise_sd, prior_mean, prior_sd)
