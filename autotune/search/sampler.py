"""The tuner's sampler, in one place: benchmarks/ replay this exact construction."""

from __future__ import annotations

import optuna


def make_sampler(seed: int | None, *, shared: bool = False) -> optuna.samplers.BaseSampler:
    """The tuner's sampler, in one place: benchmarks/sample_efficiency.py replays this exact one.
    TPE (multivariate by default in Optuna 5) reads the memory constraint that the objective
    records with `trial.set_constraint`; 5 random start-up trials before it models the space.

    `shared`: several workers sample this study at once (--devices, or a journal / database
    storage that other tuners may join). TPE then counts the trials still running as bad ones
    ("constant liar", Optuna's `constant_liar`), so that workers starting together do not all
    propose the same region. Optuna 5 turns it on by default; it is set here explicitly, off for
    a lone worker, where nothing else runs and it would only keep TPE from caching trials."""
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, constant_liar=shared)
