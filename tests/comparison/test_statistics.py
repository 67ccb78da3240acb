"""IQM, bootstrap intervals, probability of improvement and performance profiles, against
values computed by hand."""

import numpy as np
import pytest

from trajectory_transformer.comparison.statistics import (
    iqm,
    mean,
    performance_profile,
    probability_of_improvement,
    stratified_bootstrap_ci,
)


def test_iqm_drops_a_quarter_from_each_end():
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5  # the middle four: 3, 4, 5, 6
    assert iqm([1, 2, 3, 100]) == 2.5  # one cut from each end
    assert iqm([1, 2, 3]) == 2.0  # floor(3 / 4) = 0: the plain mean
    assert iqm(np.array([[1.0, 10.0], [2.0, 20.0]])) == 6.0  # all runs of all tasks: 2, 10
    assert mean([1, 2, 3, 100]) == 26.5


def test_probability_of_improvement_counts_ties_half():
    # Pairs (1, 0) (1, 2) (2, 0) (2, 2): 1 + 0 + 1 + 0.5 out of 4.
    assert probability_of_improvement([1, 2], [0, 2]) == 0.625
    assert probability_of_improvement([5, 6], [1, 2]) == 1.0
    assert probability_of_improvement([1, 2], [5, 6]) == 0.0
    assert probability_of_improvement([3, 3], [3, 3]) == 0.5


def test_bootstrap_interval_of_two_runs_spans_them():
    # Resampling [0, 1]: means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4.
    low, high = stratified_bootstrap_ci([0.0, 1.0], statistic=mean, reps=4000, seed=1)
    assert (low, high) == (0.0, 1.0)
    assert stratified_bootstrap_ci([4.0] * 5) == (4.0, 4.0)
    again = stratified_bootstrap_ci([1.0, 5.0, 2.0, 8.0], seed=3)
    assert again == stratified_bootstrap_ci([1.0, 5.0, 2.0, 8.0], seed=3)


def test_bootstrap_resamples_runs_within_each_task():
    """Task 0 always scores 0 and task 1 always 10: every stratified resample has the same
    number of runs of each task, so the mean is 5 in every one of them."""
    scores = np.array([[0.0, 10.0], [0.0, 10.0], [0.0, 10.0]])
    assert stratified_bootstrap_ci(scores, statistic=mean, reps=500) == (5.0, 5.0)


def test_performance_profile_is_the_fraction_above_each_threshold():
    profile = performance_profile([1, 2, 3, 4], np.array([0.0, 2.5, 4.0]))
    np.testing.assert_array_equal(profile, [1.0, 0.5, 0.0])


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="runs"):
        iqm([])
    with pytest.raises(ValueError, match="tasks"):
        probability_of_improvement(np.zeros((2, 2)), np.zeros((2, 3)))
