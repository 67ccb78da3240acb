import numpy as np
import pytest

from trajectory_transformer.data.episodes import (
    Episodes,
    joint_transitions,
    penalized_rewards,
    reward_to_go,
)


def make_episodes(lengths, terminated_last, seed=0):
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    terminated = np.zeros(n, dtype=bool)
    truncated = np.zeros(n, dtype=bool)
    ends = np.cumsum(lengths) - 1
    for end, term in zip(ends, terminated_last, strict=True):
        terminated[end] = term
        truncated[end] = not term
    return Episodes(
        observations=rng.normal(size=(n, 2)).astype(np.float32),
        actions=rng.normal(size=(n, 1)).astype(np.float32),
        rewards=rng.normal(size=n).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        lengths=np.asarray(lengths),
    )


def brute_force_values(rewards, lengths, discount):
    values = []
    start = 0
    for length in lengths:
        episode = rewards[start : start + length]
        for t in range(length):
            values.append(sum(discount ** (k - t - 1) * episode[k] for k in range(t + 1, length)))
        start += length
    return np.array(values)


def test_reward_to_go_matches_brute_force():
    episodes = make_episodes([5, 1, 7], [False, True, True])
    values = reward_to_go(episodes.rewards, episodes.lengths, 0.9)
    expected = brute_force_values(episodes.rewards.astype(np.float64), [5, 1, 7], 0.9)
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-5)
    # The last step of each episode sees nothing after it.
    assert values[4] == 0 and values[5] == 0 and values[12] == 0


def test_terminal_penalty_only_on_terminations():
    episodes = make_episodes([3, 4, 2], [True, False, True])
    rewards = penalized_rewards(episodes, -100.0)
    difference = rewards - episodes.rewards
    expected = np.zeros(9)
    expected[[2, 8]] = -100.0  # terminated episodes' last steps; the truncated one is untouched
    np.testing.assert_allclose(difference, expected, atol=1e-4)


def test_penalty_flows_into_earlier_values():
    episodes = make_episodes([4], [True])
    rows = joint_transitions(episodes, discount=0.5, terminal_penalty=-100.0)
    penalized = episodes.rewards.astype(np.float64).copy()
    penalized[-1] -= 100.0
    np.testing.assert_allclose(rows[:, -1], brute_force_values(penalized, [4], 0.5), atol=1e-4)
    np.testing.assert_allclose(rows[:, -2], penalized, atol=1e-4)
    np.testing.assert_allclose(rows[:, :2], episodes.observations)
    np.testing.assert_allclose(rows[:, 2:3], episodes.actions)


def test_check_finite_names_the_episode():
    episodes = make_episodes([3, 3, 3], [False] * 3)
    episodes.observations[7, 1] = np.nan
    with pytest.raises(ValueError, match=r"episode 2 .*observations at step 1"):
        episodes.check_finite()


def test_episode_returns():
    episodes = make_episodes([2, 3], [False, False])
    r = episodes.rewards
    np.testing.assert_allclose(episodes.episode_returns(), [r[:2].sum(), r[2:].sum()], rtol=1e-6)
