"""Hindsight goals: relabelled windows against rewards and values worked out by hand, and on a
real maze dataset against its own targets."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import within_half

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import Episodes, joint_transitions
from trajectory_transformer.data.goals import (
    GoalLayout,
    GoalRelabelledWindows,
    env_goal_reward,
    relabel,
)
from trajectory_transformer.data.windows import TokenWindows

LAYOUT = (("achieved_goal", (1,)), ("desired_goal", (1,)), ("observation", (1,)))
GOALS = GoalLayout.of(LAYOUT)


def line_episode(positions: list[float], goal: float) -> Episodes:
    """One episode of a point at `positions` (the last is where it ends up) pursuing `goal`,
    rewarded as `within_half`, observations `achieved | desired | 10 * step`."""
    n = len(positions) - 1
    observations = np.array([[p, goal, 10.0 * i] for i, p in enumerate(positions)], np.float32)
    rewards = within_half(observations[1:, :1], np.full((n, 1), goal)).astype(np.float32)
    return Episodes(
        observations=observations[:n],
        actions=np.arange(n, dtype=np.float32)[:, None],
        rewards=rewards,
        terminated=np.zeros(n, bool),
        truncated=np.eye(n, dtype=bool)[-1],
        lengths=np.array([n]),
        final_observations=observations[n:],
    )


def test_a_relabelled_window_ends_at_its_goal_with_the_rewards_and_values_for_it():
    episode = line_episode([0, 1, 2, 3, 4, 5, 6], goal=6.0)
    gamma = 0.9
    # From step 1, the goal reached after step 3 (position 4): steps 1, 2, 3, then the end.
    transitions, valid = relabel(
        episode, GOALS, within_half, gamma, np.array([1]), np.array([[4.0]]), np.array([3]), 4
    )
    assert valid.tolist() == [[True, True, True, False]]
    np.testing.assert_array_equal(transitions[0, :3, 1], [4.0, 4.0, 4.0])  # the new goal
    np.testing.assert_array_equal(transitions[0, :3, 0], [1.0, 2.0, 3.0])  # positions kept
    np.testing.assert_array_equal(transitions[0, :3, 3], [1.0, 2.0, 3.0])  # actions kept
    np.testing.assert_array_equal(transitions[0, :3, 4], [0.0, 0.0, 1.0])  # rewards
    np.testing.assert_allclose(transitions[0, :3, 5], [gamma, 1.0, 0.0])  # reward-to-go
    np.testing.assert_array_equal(transitions[0, 3], 0.0)  # past the end: padding


def test_the_relabelled_episode_ends_at_the_first_step_that_reaches_its_goal():
    # The point passes 2 after step 1, comes back and reaches 2 again after step 5.
    episode = line_episode([0, 1, 2, 3, 4, 3, 2], goal=2.0)
    transitions, valid = relabel(
        episode, GOALS, within_half, 0.5, np.array([0]), np.array([[2.0]]), np.array([5]), 6
    )
    assert valid.tolist() == [[True, True, False, False, False, False]]
    np.testing.assert_array_equal(transitions[0, :2, 4], [0.0, 1.0])
    np.testing.assert_array_equal(transitions[0, :2, 5], [1.0, 0.0])


def test_a_continuing_relabelled_episode_rewards_every_step_at_its_goal_to_the_end():
    # The same point: at 2 after step 1, away, back at 2 after step 5, the episode's end.
    episode = line_episode([0, 1, 2, 3, 4, 3, 2], goal=2.0)
    transitions, valid = relabel(
        episode,
        GOALS,
        within_half,
        0.5,
        np.array([0]),
        np.array([[2.0]]),
        np.array([1]),
        6,
        end_at_goal=False,
    )
    assert valid.all()
    np.testing.assert_array_equal(transitions[0, :, 4], [0, 1, 0, 0, 0, 1])
    np.testing.assert_allclose(transitions[0, :, 5], [1.0625, 0.125, 0.25, 0.5, 1.0, 0.0])


def test_relabelling_an_episode_with_its_own_goal_gives_back_its_targets():
    episode = line_episode([0.0, 0.7, 1.6, 2.2, 3.1, 3.9], goal=4.0)
    expected = joint_transitions(episode, 0.95, -100.0)
    n = episode.num_transitions
    for start in range(n):
        transitions, valid = relabel(
            episode,
            GOALS,
            within_half,
            0.95,
            np.array([start]),
            np.array([[4.0]]),
            np.array([n - 1]),
            n - start,
        )
        assert valid.all()
        np.testing.assert_allclose(transitions[0], expected[start:], rtol=1e-6)


def test_a_dataset_without_goals_is_refused_with_the_setting_that_trains_without_them():
    with pytest.raises(ValueError, match=r"dataset\.relabel_goals=0"):
        GoalLayout.of(None)
    with pytest.raises(ValueError, match="desired_goal"):
        GoalLayout.of((("achieved_goal", (2,)), ("observation", (4,))))
    with pytest.raises(ValueError, match=r"dataset\.relabel_goals=0"):
        env_goal_reward(gym.make("Pendulum-v1"))


def test_relabelled_batches_hold_the_relabelled_windows_tokens_and_masks():
    episodes = line_episode([float(p) for p in range(12)], goal=11.0)
    transitions = joint_transitions(episodes, 0.9, -100.0)
    discretizer = Discretizer.fit(transitions, 16)
    windows = TokenWindows(transitions, episodes.lengths, discretizer, 3, real_values=True)
    ids = torch.arange(len(windows))
    never = GoalRelabelledWindows(windows, episodes, discretizer, GOALS, within_half, 0.9, 0.0)
    for got, want in zip(never.batch(ids), windows.batch(ids), strict=True):
        torch.testing.assert_close(got, want)

    always = GoalRelabelledWindows(windows, episodes, discretizer, GOALS, within_half, 0.9, 1.0)
    torch.manual_seed(0)
    tokens, mask, values = always.batch(ids)
    # Each window's goal is a position its episode reaches at or after its start, and its
    # tokens are the relabelled transitions', encoded.
    T = windows.transition_dim
    rows = values.reshape(len(ids), 3, T)
    goals = rows[:, 0, 1]
    assert (goals >= ids.float() + 1).all() and (goals <= 11).all()
    assert not (goals == 11.0).all()  # not the dataset's own goal every time
    for window in range(len(ids)):
        goal_step = int(goals[window]) - 1
        want, valid = relabel(
            episodes,
            GOALS,
            within_half,
            0.9,
            np.array([window]),
            np.array([[goals[window].item()]]),
            np.array([goal_step]),
            3,
        )
        torch.testing.assert_close(rows[window], torch.as_tensor(want[0]))
        assert mask[window].tolist() == np.repeat(valid[0], T).tolist()
        encoded = discretizer.encode(torch.as_tensor(want[0]))
        assert tokens[window].tolist() == encoded.flatten().tolist()


def test_windows_relabelled_with_a_goal_they_reach_go_on_past_it_rewarded_where_they_stay():
    # The point comes to rest at 4 for three steps, then leaves: each window is relabelled
    # with where the point is after one of its own steps, rewarded at every step within 0.5
    # of it, to the episode's end.
    episodes = line_episode([0, 3, 4, 4, 4, 6, 8, 10], goal=10.0)
    transitions = joint_transitions(episodes, 0.5, -100.0)
    discretizer = Discretizer.fit(transitions, 16)
    windows = TokenWindows(transitions, episodes.lengths, discretizer, 3, real_values=True)
    reaching = GoalRelabelledWindows(
        windows, episodes, discretizer, GOALS, within_half, 0.5, 0.0, reached=1.0
    )
    torch.manual_seed(0)
    ids = torch.arange(len(windows))
    _, mask, values = reaching.batch(ids)
    rows = values.reshape(len(ids), 3, windows.transition_dim)
    goals = rows[:, 0, 1].numpy()
    positions = np.array([3, 4, 4, 4, 6, 8, 10], np.float32)  # after each step
    for window in range(len(ids)):
        assert goals[window] in positions[window : window + 3]
        goal_step = window + int(np.flatnonzero(positions[window:] == goals[window])[0])
        want, valid = relabel(
            episodes,
            GOALS,
            within_half,
            0.5,
            np.array([window]),
            goals[window : window + 1, None],
            np.array([goal_step]),
            3,
            end_at_goal=False,
            continuing_scale=0.5,  # 1 - discount: the default, scaled rewards
        )
        torch.testing.assert_close(rows[window], torch.as_tensor(want[0]))
        # Nothing ends at the goal: only the episode's own end.
        assert valid[0].tolist() == [window + step < len(positions) for step in range(3)]
        assert mask[window].tolist() == np.repeat(valid[0], windows.transition_dim).tolist()
    # By hand, from step 1 (at 3 after it, then at rest at 4) with the goal 4: rewarded while
    # at rest; each value is what is left of those rewards. Scaled by 1 - discount = 0.5, each
    # reward is 0.5: V_0 = 0.5 + 0.5 * 0.5.
    for scale, rewards, values in [
        (1.0, [1.0, 1.0, 1.0, 0.0, 0.0], [1.5, 1.0, 0.0, 0.0, 0.0]),
        (0.5, [0.5, 0.5, 0.5, 0.0, 0.0], [0.75, 0.5, 0.0, 0.0, 0.0]),
    ]:
        want, _ = relabel(
            episodes,
            GOALS,
            within_half,
            0.5,
            np.array([1]),
            np.array([[4.0]]),
            np.array([1]),
            5,
            end_at_goal=False,
            continuing_scale=scale,
        )
        np.testing.assert_array_equal(want[0, :, 4], rewards)
        np.testing.assert_allclose(want[0, :, 5], values)


def test_scaled_rewards_apply_to_continuing_episodes_alone():
    # Two windows relabelled with the same goal, reached after step 2 and never left: the one
    # that ends at its goal keeps the reward of arriving, 1; the one that goes on is rewarded
    # 1 - discount at every step at the goal, so that staying for good is worth 1.
    episodes = line_episode([0.0, 1.0] + [2.0] * 40, goal=2.0)
    both, _ = relabel(
        episodes,
        GOALS,
        within_half,
        0.9,
        np.array([0, 0]),
        np.array([[2.0], [2.0]]),
        np.array([1, 1]),
        3,
        end_at_goal=np.array([True, False]),
        continuing_scale=0.1,
    )
    np.testing.assert_allclose(both[0, :, 4:], [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    # Rewarded 0.1 after steps 1-40: V_0 = 0.1 * sum_{k<40} 0.9^k = 1 - 0.9^40.
    np.testing.assert_allclose(both[1, :, 4], [0.0, 0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(both[1, :, 5], [1 - 0.9**40, 1 - 0.9**39, 1 - 0.9**38], rtol=1e-5)


@pytest.mark.parametrize("continuing_rewards", ["raw", "scaled"])
def test_values_of_continuing_windows_above_the_bins_are_counted(continuing_rewards):
    # The dataset's own values (one reward, at the end) are at most 1, and the bins are fit on
    # them. A point that rests at a goal for many steps, relabelled with it, is rewarded at
    # every one: with raw rewards, values above the bins, encoded as the top bin; scaled by
    # 1 - discount, within them. A point that passes each place once is rewarded once: values
    # within them either way.
    def reaching(positions: list[float]) -> GoalRelabelledWindows:
        episodes = line_episode(positions, goal=positions[-1])
        transitions = joint_transitions(episodes, 0.9, -100.0)
        discretizer = Discretizer.fit(transitions, 16)
        windows = TokenWindows(transitions, episodes.lengths, discretizer, 3, real_values=True)
        return GoalRelabelledWindows(
            windows,
            episodes,
            discretizer,
            GOALS,
            within_half,
            0.9,
            0.0,
            reached=1.0,
            continuing_rewards=continuing_rewards,
        )

    resting = reaching([0.0, 1.0] + [2.0] * 10 + [4.0])
    share, largest, top = resting.continuing_values_above_bins(count=500)
    # The point is at 2 after each of steps 1-10: relabelled with it from step 0, the value
    # there is sum_{k<10} 0.9^k = 6.51 (raw), the largest, or 0.1 of it (scaled).
    resting_value = (1 - 0.9**10) / 0.1
    assert top == pytest.approx(1.0)
    if continuing_rewards == "raw":
        assert 0.5 < share < 1.0 and largest == pytest.approx(resting_value, rel=1e-5)
    else:
        assert share == 0.0 and largest == pytest.approx(0.1 * resting_value, rel=1e-5)
    torch.manual_seed(3)
    before = torch.rand(1)
    torch.manual_seed(3)
    resting.continuing_values_above_bins(count=10)
    assert torch.rand(1) == before  # torch's generator, a run's saved state, untouched

    passing = reaching([float(p) for p in range(12)])
    share, largest, _ = passing.continuing_values_above_bins(count=500)
    assert share == 0.0 and largest == pytest.approx(1.0 if continuing_rewards == "raw" else 0.1)


def test_later_goals_that_go_on_past_their_goal_are_counted_with_the_continuing_windows():
    episodes = line_episode([0.0, 1.0] + [2.0] * 10 + [4.0], goal=4.0)
    transitions = joint_transitions(episodes, 0.9, -100.0)
    discretizer = Discretizer.fit(transitions, 16)
    windows = TokenWindows(transitions, episodes.lengths, discretizer, 3, real_values=True)

    def relabelling(**settings) -> GoalRelabelledWindows:
        return GoalRelabelledWindows(
            windows, episodes, discretizer, GOALS, within_half, 0.9, 0.5, **settings
        )

    assert relabelling().continuing == 0.0  # later goals that end there: nothing to count
    with pytest.raises(ValueError, match="goes on past its goal"):
        relabelling().continuing_values_above_bins()
    going_on = relabelling(end_at_goal=False, continuing_rewards="raw")
    assert going_on.continuing == 0.5
    assert going_on.continuing_values_above_bins(count=500).share > 0.3


def test_scaled_continuing_rewards_need_a_discount_below_one():
    episodes = line_episode([0.0, 1.0, 2.0], goal=2.0)
    transitions = joint_transitions(episodes, 1.0, -100.0)
    discretizer = Discretizer.fit(transitions, 4)
    windows = TokenWindows(transitions, episodes.lengths, discretizer, 2)
    with pytest.raises(ValueError, match="relabel_continuing_rewards=raw"):
        GoalRelabelledWindows(
            windows, episodes, discretizer, GOALS, within_half, 1.0, 0.0, reached=1.0
        )
    with pytest.raises(ValueError, match="one of scaled, raw"):
        GoalRelabelledWindows(
            windows, episodes, discretizer, GOALS, within_half, 0.9, 0.0, continuing_rewards="x"
        )


def test_a_batch_mixes_later_goals_reached_goals_and_the_datasets_own():
    episodes = line_episode([float(p) for p in range(40)], goal=39.0)
    transitions = joint_transitions(episodes, 0.9, -100.0)
    discretizer = Discretizer.fit(transitions, 16)
    windows = TokenWindows(transitions, episodes.lengths, discretizer, 3, real_values=True)
    mixed = GoalRelabelledWindows(
        windows, episodes, discretizer, GOALS, within_half, 0.9, 0.4, reached=0.4
    )
    torch.manual_seed(1)
    ids = torch.arange(len(windows)).repeat(20)
    _, mask, values = mixed.batch(ids)
    goals = values.reshape(len(ids), 3, -1)[:, 0, 1].numpy()
    start = ids.numpy().astype(np.float32)
    own = goals == 39.0
    within = (goals >= start + 1) & (goals <= start + 3) & ~own
    later = (goals > start + 3) & ~own
    assert 0.25 < within.mean() < 0.55 and 0.2 < later.mean() < 0.55 and own.mean() > 0.1
    # Goals the window reaches go on past it; a later goal drawn among the window's own steps,
    # rarely, ends the window's episode at its step.
    ends_early = ~mask.reshape(len(ids), 3, -1).all(dim=2).all(dim=1).numpy()
    assert ends_early[within & (start < 36)].mean() < 0.2


def test_relabelling_probabilities_that_sum_past_one_are_refused():
    episodes = line_episode([0.0, 1.0, 2.0], goal=2.0)
    transitions = joint_transitions(episodes, 0.9, -100.0)
    discretizer = Discretizer.fit(transitions, 4)
    windows = TokenWindows(transitions, episodes.lengths, discretizer, 2)
    with pytest.raises(ValueError, match="sum to at most 1"):
        GoalRelabelledWindows(
            windows, episodes, discretizer, GOALS, within_half, 0.9, 0.7, reached=0.5
        )


def test_on_a_maze_dataset_relabelling_with_its_own_goals_gives_back_its_targets(tmp_path):
    """The maze's own reward (gymnasium-robotics' compute_reward) and its episodes, each cut at
    its goal: relabelled with that goal, every window gets the dataset's rewards and values."""
    from trajectory_transformer.data.minari_source import load_episodes
    from trajectory_transformer.suites import pointmaze

    pointmaze.SUITES[0].build("pointmaze/umaze-v0", episodes=3, reference_episodes=2)
    episodes, info = load_episodes("pointmaze/umaze-v0")
    goals = GoalLayout.of(info.observation_layout)
    reward = env_goal_reward(info.make_env())
    expected = joint_transitions(episodes, 0.99, -100.0)
    for start, length in zip(episodes.starts, episodes.lengths, strict=True):
        last = start + length - 1
        goal = episodes.observations[last, goals.desired][None, :]
        transitions, valid = relabel(
            episodes, goals, reward, 0.99, np.array([start]), goal, np.array([last]), length
        )
        assert valid.all()
        np.testing.assert_allclose(transitions[0], expected[start : last + 1], rtol=1e-5)


def test_the_rewards_past_the_goal_that_a_config_trains_with():
    from trajectory_transformer.data.goals import continuing_rewards_of

    assert continuing_rewards_of({"relabel_goals": 0.5}) is None  # episodes end at their goals
    assert continuing_rewards_of({"relabel_reached": 0.25}) == "raw"  # before the setting
    going_on = {"relabel_goals": 0.5, "relabel_end_at_goal": False}
    assert continuing_rewards_of(going_on | {"relabel_continuing_rewards": "scaled"}) == "scaled"
