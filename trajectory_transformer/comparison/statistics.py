"""Aggregate scores over training seeds: IQM, bootstrap intervals, probability of improvement.

The runs axis is the training seed: the evaluation episodes of one seed are averaged into that
seed's score first and never treated as independent runs. Scores are arrays `(runs, tasks)`
(a single dataset is one task); the bootstrap resamples runs within each task (stratified), as
in Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical Precipice"
(NeurIPS 2021).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Statistic = Callable[[np.ndarray], float]


def _as_runs_by_tasks(scores: np.ndarray | list[float]) -> np.ndarray:
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 1:
        scores = scores[:, None]
    if scores.ndim != 2 or scores.shape[0] == 0:
        raise ValueError(f"scores must be (runs,) or (runs, tasks), got shape {scores.shape}")
    return scores


def iqm(scores: np.ndarray | list[float]) -> float:
    """Interquartile mean: the mean of the middle half of all scores, after dropping
    `floor(n / 4)` from each end (as `scipy.stats.trim_mean(x, 0.25)` does)."""
    values = np.sort(_as_runs_by_tasks(scores).ravel())
    cut = int(0.25 * len(values))
    return float(values[cut : len(values) - cut].mean())


def mean(scores: np.ndarray | list[float]) -> float:
    return float(_as_runs_by_tasks(scores).mean())


def stratified_bootstrap_ci(
    scores: np.ndarray | list[float],
    statistic: Statistic = iqm,
    reps: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of `statistic` over `reps` resamplings of the runs, each task's
    runs resampled with replacement on their own."""
    scores = _as_runs_by_tasks(scores)
    rng = np.random.default_rng(seed)
    runs, tasks = scores.shape
    draws = rng.integers(0, runs, size=(reps, runs, tasks))  # run index per (rep, run, task)
    resampled = np.take_along_axis(scores[None], draws, axis=1)  # (reps, runs, tasks)
    values = np.array([statistic(sample) for sample in resampled])
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def probability_of_improvement(x: np.ndarray | list[float], y: np.ndarray | list[float]) -> float:
    """P(X > Y) for a run of X and a run of Y drawn at random, ties counting half (the
    Mann-Whitney statistic over all pairs of runs, averaged over tasks)."""
    x, y = _as_runs_by_tasks(x), _as_runs_by_tasks(y)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x has {x.shape[1]} tasks and y {y.shape[1]}")
    greater = (x[:, None, :] > y[None, :, :]).mean(axis=(0, 1))
    ties = (x[:, None, :] == y[None, :, :]).mean(axis=(0, 1))
    return float((greater + 0.5 * ties).mean())


def performance_profile(scores: np.ndarray | list[float], thresholds: np.ndarray) -> np.ndarray:
    """The fraction of runs (over all tasks) scoring above each threshold, (len(thresholds),)."""
    values = _as_runs_by_tasks(scores).ravel()
    return (values[None, :] > np.asarray(thresholds, dtype=np.float64)[:, None]).mean(axis=1)
