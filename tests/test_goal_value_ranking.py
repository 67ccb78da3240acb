"""scripts/goal_value_ranking.py: how a goal-conditioned model's value ranks states on the way
to the goal."""

from __future__ import annotations

import goal_value_ranking  # scripts/, on pytest's path
import numpy as np
import pytest


def test_pairs_lie_horizon_apart_within_episodes_that_reach_their_goal():
    # Three episodes: rows 0-4 (reaches), 5-14 (does not), 15-29 (reaches).
    starts, lengths = np.array([0, 5, 15]), np.array([5, 10, 15])
    reached = np.array([True, False, True])
    pairs, left = goal_value_ranking.draw_pairs(
        starts, lengths, reached, horizon=3, pairs=500, seed=0
    )
    assert (pairs[:, 1] - pairs[:, 0] == 3).all()
    first_episode = pairs[:, 0] < 5
    # Episode 0 pairs rows 0-1 with 3-4; episode 2 rows 15-26 with 18-29; none from episode 1.
    assert set(pairs[first_episode, 0]) == {0, 1}
    assert set(pairs[~first_episode, 0]) == set(range(15, 27))
    # Steps left: to the end of the episode, from the pair's first state.
    ends = np.where(first_episode, 5, 30)
    assert (left == ends - pairs[:, 0]).all()


def test_the_table_of_an_untrained_maze_model(maze_checkpoint, capsys):
    arguments = [str(maze_checkpoint), "--pairs", "40", "--horizon", "2", "--labels", "tiny"]
    rows = goal_value_ranking.main(arguments)
    assert rows and sum(int(row[2]) for row in rows) == 40
    for label, _, _, rises, value, target in rows:
        assert label == "tiny"
        assert 0 <= int(rises.rstrip("%")) <= 100
        float(value), float(target)
    assert capsys.readouterr().out.count("|") >= 4 * len(rows)


def test_a_critic_is_valued_by_its_v_in_the_models_units(maze_checkpoint, tmp_path):
    import torch

    from trajectory_transformer.checkpoint import save_atomic
    from trajectory_transformer.critic.model import build_critic_payload
    from trajectory_transformer.critic.training import CriticConfig, new_critic
    from trajectory_transformer.data.minari_source import load_episodes

    episodes, info = load_episodes("pointmaze/umaze-v0")
    torch.manual_seed(0)
    critic, policy = new_critic(episodes, CriticConfig(hidden_dim=8), [-1.0] * 2, [1.0] * 2)
    torch.nn.init.constant_(critic.v[-1].bias, 50.0)  # V = 50 + a small part of the state
    rows = {}
    for relabel in (0.0, 0.5):
        path = tmp_path / f"critic-{relabel}.pt"
        config = {"critic": {"relabel_goals": relabel}}
        save_atomic(build_critic_payload(critic, policy, info, config, {"step": 0}), path)
        arguments = [str(path), "--pairs", "40", "--horizon", "2"]
        rows[relabel] = goal_value_ranking.main(arguments)
    for plain, relabelled in zip(rows[0.0], rows[0.5], strict=True):
        assert plain[1:4] == relabelled[1:4]  # the same pairs rise or fall: V, scaled
        # Trained on hindsight goals, arriving is worth 1 / (1 - discount) of a model's value.
        assert float(relabelled[4]) == pytest.approx(0.01 * float(plain[4]), abs=1e-3)
        assert 45 < float(plain[4]) < 55


def test_a_pretrained_maze_model_is_valued_without_its_hold_at_the_goal(maze_checkpoint):
    # Its manifest plans with a hold at the goal, which samples actions: the greedy valuation
    # of one step sets it aside.
    arguments = ["pretrained:pointmaze/umaze-v0", "--pairs", "20", "--horizon", "2"]
    rows = goal_value_ranking.main(arguments)
    assert sum(int(row[2]) for row in rows) == 20
