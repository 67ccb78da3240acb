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


def test_check_finite_names_an_episode_with_a_non_finite_final_observation():
    from dataclasses import replace

    episodes = make_episodes([3, 3, 3], [False] * 3)
    finals = np.zeros((3, episodes.observation_dim), dtype=np.float32)
    finals[1, 0] = np.inf
    with pytest.raises(ValueError, match=r"episode 1 .*final observation"):
        replace(episodes, final_observations=finals).check_finite()


def test_episode_returns():
    episodes = make_episodes([2, 3], [False, False])
    r = episodes.rewards
    np.testing.assert_allclose(episodes.episode_returns(), [r[:2].sum(), r[2:].sum()], rtol=1e-6)


def test_value_targets_from_minari_flags_penalise_terminations_and_not_truncations():
    """From a Minari dataset's termination and truncation flags to the reward and value tokens,
    against a plain computation: a fall (or a fall on the time limit's last step) is penalised
    and the penalty flows into the earlier values; a time-limit cut is not, and its values are
    the plain reward-to-go of its own rewards (nothing crosses from a neighbouring episode)."""
    from conftest import create_dataset, make_episode

    from trajectory_transformer.data.minari_source import load_episodes

    discount, penalty = 0.9, -100.0
    ends = [("fell", 5), ("cut", 6), ("fell at the limit", 4), ("fell", 1), ("cut", 3)]
    rng = np.random.default_rng(3)
    buffers = []
    for i, (end, length) in enumerate(ends):
        buffer = make_episode(rng, length, 3, 1, terminated=end != "cut", seed=i)
        if end == "fell at the limit":
            buffer.truncations[-1] = True  # TimeLimit flags both when the fall is its last step
        buffers.append(buffer)
    create_dataset("test/ends-v0", buffers=buffers)

    episodes, _ = load_episodes("test/ends-v0")
    rows = joint_transitions(episodes, discount=discount, terminal_penalty=penalty)

    expected_rewards, expected_values = [], []
    for buffer, (end, length) in zip(buffers, ends, strict=True):
        rewards = [float(r) for r in buffer.rewards]
        if end != "cut":
            rewards[-1] += penalty
        for t in range(length):
            following = range(t + 1, length)
            expected_values.append(sum(discount ** (k - t - 1) * rewards[k] for k in following))
        expected_rewards += rewards
    np.testing.assert_allclose(rows[:, -2], expected_rewards, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(rows[:, -1], expected_values, rtol=1e-5, atol=1e-4)

    starts = np.cumsum([0] + [length for _, length in ends])
    for (end, _), start, stop in zip(ends, starts[:-1], starts[1:], strict=True):
        assert episodes.terminated[stop - 1] == (end != "cut")
        assert episodes.truncated[stop - 1] == (end == "cut")
        assert rows[stop - 1, -1] == 0.0  # nothing follows an episode's last step
        if end == "cut":
            raw = episodes.rewards[start:stop].astype(np.float64)
            plain = brute_force_values(raw, [stop - start], discount)
            np.testing.assert_allclose(rows[start:stop, -1], plain, rtol=1e-5, atol=1e-5)
            assert rows[stop - 1, -2] == pytest.approx(raw[-1], abs=1e-6)
