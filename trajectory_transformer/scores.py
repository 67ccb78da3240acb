"""Scores on the D4RL scale, and the one convention for their spread."""

from __future__ import annotations

import math

import numpy as np


def normalized_score(
    returns: np.ndarray | float, ref_min: float | None, ref_max: float | None
) -> np.ndarray | None:
    """`100 * (return - ref_min) / (ref_max - ref_min)`: 0 for the reference minimum (a random
    policy), 100 for the maximum (an expert); None without reference scores."""
    if ref_min is None or ref_max is None:
        return None
    return 100.0 * (np.asarray(returns, dtype=np.float64) - ref_min) / (ref_max - ref_min)


def mean_and_stderr(values: np.ndarray | list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample standard deviation, ddof=1); the error of
    a single value is 0."""
    array = np.asarray(values, dtype=np.float64)
    stderr = array.std(ddof=1) / math.sqrt(len(array)) if len(array) > 1 else 0.0
    return float(array.mean()), float(stderr)
