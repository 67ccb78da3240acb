"""The critic on hindsight goals: relabelled batches against rewards and terminations worked out
by hand, values of goals far along a path learned by TD, and the command line."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import run_module, synthetic_maze_dataset, within_half

from trajectory_transformer.critic.training import (
    CriticConfig,
    CriticTrainer,
    GoalRelabelledTransitions,
    critic_transitions,
    new_critic,
)
from trajectory_transformer.data.episodes import Episodes
from trajectory_transformer.data.goals import GoalLayout

LAYOUT = (("achieved_goal", (1,)), ("desired_goal", (1,)), ("observation", (1,)))
GOALS = GoalLayout.of(LAYOUT)
DISCOUNT = 0.9
STAY = 1.0 / (1.0 - DISCOUNT)  # the return of staying at the goal for good: 10


def line_episodes(lengths: list[int], goal: float = 100.0) -> Episodes:
    """Episodes of a point stepping right from 0 (one unit a step, action 1), observations
    `achieved | desired | position`, pursuing `goal` (never reached: the only goals reached
    are relabelled ones), each cut at its end by truncation."""
    observations, finals = [], []
    for n in lengths:
        positions = np.arange(n + 1, dtype=np.float32)
        observations.append(np.stack([positions, np.full(n + 1, goal), positions], axis=1))
        finals.append(observations[-1][-1])
        observations[-1] = observations[-1][:-1]
    total = sum(lengths)
    truncated = np.zeros(total, bool)
    truncated[np.cumsum(lengths) - 1] = True
    return Episodes(
        observations=np.concatenate(observations),
        actions=np.ones((total, 1), np.float32),
        rewards=np.zeros(total, np.float32),
        terminated=np.zeros(total, bool),
        truncated=truncated,
        lengths=np.array(lengths),
        final_observations=np.stack(finals),
    )


def goal_transitions(
    critic, episodes: Episodes, probability: float, scale: float = 1.0, bias: float = 0.0
) -> GoalRelabelledTransitions:
    transitions = critic_transitions(critic, episodes, "cpu")
    return GoalRelabelledTransitions(
        transitions, episodes, GOALS, within_half, probability, DISCOUNT, scale, bias
    )


def relabelled(episodes: Episodes, probability: float, scale: float = 1.0, bias: float = 0.0):
    cfg = CriticConfig(discount=DISCOUNT, terminal_penalty=0.0, hidden_dim=8)
    critic, _ = new_critic(episodes, cfg, [-1.0], [1.0])
    return goal_transitions(critic, episodes, probability, scale, bias)


def test_a_relabelled_row_is_conditioned_on_a_later_goal_rewarded_and_ended_there():
    episodes = line_episodes([5, 4])  # rows 0-4 the first episode, 5-8 the second
    batches = relabelled(episodes, probability=1.0)
    rows = torch.arange(9).repeat(40)
    obs, actions, rewards, next_obs, terminated = batches.batch(
        rows, torch.Generator().manual_seed(0)
    )
    position, goal = obs[:, 0].numpy(), obs[:, 1].numpy()
    last = np.where(rows.numpy() < 5, 5.0, 4.0)  # the episode's last achieved goal
    # Every goal is an achieved goal after a step of the row's episode, its own or later.
    assert ((goal >= position + 1) & (goal <= last)).all()
    assert (goal == np.round(goal)).all()
    torch.testing.assert_close(next_obs[:, 1], obs[:, 1])  # s' has the same goal
    torch.testing.assert_close(next_obs[:, 0], obs[:, 0] + 1.0)  # positions kept
    torch.testing.assert_close(actions, torch.ones(len(rows), 1))
    # Reached after this step (the goal is where it lands): the return of staying, and the end.
    reached = goal == position + 1
    assert reached.any() and (~reached).any()
    np.testing.assert_allclose(rewards.numpy(), np.where(reached, STAY, 0.0), rtol=1e-6)
    np.testing.assert_array_equal(terminated.numpy(), reached.astype(np.float32))
    # A last row can only be relabelled with the goal its own step reaches.
    at_last = np.isin(rows.numpy(), [4, 8])
    assert reached[at_last].all()


def test_rows_not_relabelled_keep_their_goal_and_are_rewarded_by_it_scaled():
    episodes = line_episodes([6], goal=3.0)  # the point passes its own goal after step 2
    batches = relabelled(episodes, probability=1e-9, scale=2.0, bias=-1.0)
    obs, _, rewards, next_obs, terminated = batches.batch(torch.arange(6))
    np.testing.assert_array_equal(obs[:, 1].numpy(), 3.0)
    np.testing.assert_array_equal(next_obs[:, 1].numpy(), 3.0)
    reached = np.array([0, 0, 1, 0, 0, 0], bool)  # step 2 lands on 3
    np.testing.assert_allclose(rewards.numpy(), np.where(reached, 2 * STAY - 1, -1.0), rtol=1e-6)
    np.testing.assert_array_equal(terminated.numpy(), reached.astype(np.float32))


def test_the_relabelling_share_must_be_a_probability():
    with pytest.raises(ValueError, match=r"critic\.relabel_goals must be in"):
        CriticConfig(relabel_goals=1.5)
    with pytest.raises(ValueError, match="relabelling probability must be in"):
        relabelled(line_episodes([3]), probability=0.0)


def test_a_resumed_critic_draws_the_same_goals_as_one_never_stopped():
    episodes = line_episodes([5, 4, 6])
    cfg = CriticConfig(
        discount=DISCOUNT, terminal_penalty=0.0, hidden_dim=8, batch_size=8, steps=10
    )

    def fresh() -> CriticTrainer:
        torch.manual_seed(0)
        critic, policy = new_critic(episodes, cfg, [-1.0], [1.0])
        transitions = goal_transitions(critic, episodes, 0.5)
        return CriticTrainer(critic, policy, transitions, cfg, save=lambda s: None, progress=False)

    straight = fresh()
    straight.train()
    halfway = fresh()
    for _ in range(4):
        halfway.train_step(torch.randint(15, (8,), generator=halfway.generator))
    state = halfway.state()
    networks = halfway.critic.state_dict(), halfway.policy.state_dict()
    resumed = fresh()
    resumed.critic.load_state_dict(networks[0])
    resumed.policy.load_state_dict(networks[1])
    resumed.load_state(state)
    resumed.train()
    for name, tensor in straight.critic.state_dict().items():
        torch.testing.assert_close(resumed.critic.state_dict()[name], tensor, msg=name)


def test_td_on_hindsight_goals_values_goals_far_along_the_path():
    """On paths that only ever step right, a goal g steps ahead of position k is reached
    after g - k steps: Q(k, right | g) = discount^(g - k - 1) * STAY, learned by chaining
    one-step targets, as the paths of a maze chain into values of distant goals."""
    torch.manual_seed(0)
    episodes = line_episodes([6] * 20)
    cfg = CriticConfig(
        discount=DISCOUNT,
        terminal_penalty=0.0,
        hidden_dim=64,
        batch_size=128,
        learning_rate=3e-3,
        target_update_rate=0.1,
        steps=800,
        relabel_goals=1.0,
        normalize_observations=False,
        log_every=10_000,
        checkpoint_every=10_000,
    )
    critic, policy = new_critic(episodes, cfg, [-1.0], [1.0])
    transitions = goal_transitions(critic, episodes, 1.0)
    CriticTrainer(critic, policy, transitions, cfg, save=lambda s: None, progress=False).train()
    pairs = torch.tensor([[k, g] for k in range(5) for g in range(k + 1, 7)], dtype=torch.float32)
    observations = torch.stack([pairs[:, 0], pairs[:, 1], pairs[:, 0]], dim=1)
    expected = STAY * DISCOUNT ** (pairs[:, 1] - pairs[:, 0] - 1)
    with torch.no_grad():
        q = critic.q(observations, torch.ones(len(pairs), 1))
    torch.testing.assert_close(q, expected, atol=0.5, rtol=0.05)


def test_the_command_line_trains_on_hindsight_goals_and_refuses_a_dataset_without_them(
    tmp_path, tiny_dataset
):
    synthetic_maze_dataset("test/dict-maze-critic-v0")
    common = ["critic.steps=4", "critic.hidden_dim=16", "critic.batch_size=32", "device=cpu"]
    done = run_module(
        "trajectory_transformer.cli.train_critic",
        "dataset.id=test/dict-maze-critic-v0",
        "critic.relabel_goals=0.5",
        *common,
        f"hydra.run.dir={tmp_path / 'goals'}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "50% of every batch conditioned on a goal its episode reaches later" in done.stdout
    assert "trained the critic 4 steps" in done.stdout

    refused = run_module(
        "trajectory_transformer.cli.train_critic",
        "dataset.id=test/tiny-v0",
        "critic.relabel_goals=0.5",
        *common,
        f"hydra.run.dir={tmp_path / 'flat'}",
    )
    assert refused.returncode == 2
    assert "relabelling goals needs Dict observations" in refused.stderr
    assert "set critic.relabel_goals=0" in refused.stderr


def test_a_true_termination_still_ends_its_row():
    ended = np.eye(4, dtype=bool)[-1]
    episodes = replace(line_episodes([4]), terminated=ended, truncated=np.zeros(4, bool))
    _, _, rewards, _, terminated = relabelled(episodes, probability=1e-9).batch(torch.arange(4))
    np.testing.assert_array_equal(terminated.numpy(), [0, 0, 0, 1])  # the goal is never reached
    np.testing.assert_array_equal(rewards.numpy(), 0.0)
