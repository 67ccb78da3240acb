"""A Minari dataset of Dict observations (PointMaze's keys, made with
`minari.create_dataset_from_buffers`) trains and plans end to end through tt-train and
tt-eval, the evaluation env flattened as the dataset was."""

from __future__ import annotations

import json
from dataclasses import replace

import gymnasium as gym
import gymnasium_robotics
import numpy as np
import torch
from conftest import TINY_TRAINING, create_dataset, make_episode, run_module

gym.register_envs(gymnasium_robotics)

SPACE = gym.spaces.Dict(
    {
        "observation": gym.spaces.Box(-np.inf, np.inf, (4,), np.float64),
        "achieved_goal": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
        "desired_goal": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
    }
)


def synthetic_maze_dataset(dataset_id: str = "test/dict-maze-v0", episodes: int = 8):
    """Random goal-conditioned episodes of 12-14 steps with a sparse reward at the end."""
    rng = np.random.default_rng(0)
    buffers = []
    for i in range(episodes):
        n = 12 + i % 3
        position = np.cumsum(rng.normal(0, 0.1, (n + 1, 2)), axis=0)
        goal = np.repeat(rng.uniform(-1, 1, (1, 2)), n + 1, axis=0)
        velocity = rng.normal(0, 1, (n + 1, 2))
        observations = {
            "observation": np.concatenate([position, velocity], axis=1),
            "achieved_goal": position,
            "desired_goal": goal,
        }
        buffer = make_episode(rng, n, 1, 2, terminated=False, seed=i)
        rewards = np.zeros(n)
        rewards[-1] = 1.0
        buffers.append(replace(buffer, observations=observations, rewards=rewards))
    return create_dataset(
        dataset_id,
        buffers=buffers,
        observation_space=SPACE,
        env="PointMaze_UMaze-v3",
        ref_scores=(0.0, 100.0),
        action_bound=1.0,
        act_dim=2,
    )


def test_a_dict_dataset_trains_and_plans_end_to_end(tmp_path):
    synthetic_maze_dataset()
    run = tmp_path / "run"
    trained = run_module(
        "trajectory_transformer.cli.train",
        *TINY_TRAINING,
        "dataset.id=test/dict-maze-v0",
        "dataset.relabel_goals=0.5",  # hindsight goals, rewarded by the maze's compute_reward
        "dataset.relabel_reached=0.25",
        "dataset.relabel_continuing_rewards=raw",  # the environment's rewards past the goal
        "trainer.max_steps=4",
        f"hydra.run.dir={run}",
    )
    assert trained.returncode == 0, trained.stderr
    assert "50% of the training windows relabelled" in trained.stdout
    # The random walk stays within the goal's radius for steps on end: rewarded 1 at each, the
    # windows that reach their goal have values above the bins fit on the dataset's (at most 1).
    assert "relabelled with an episode that goes on past its goal" in trained.stdout
    assert "lie above the value bins (fit on the dataset's own values, up to 1)" in trained.stdout
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    assert payload["dataset"]["observation_dim"] == 8
    assert [key for key, _ in payload["dataset"]["observation_layout"]] == [
        "achieved_goal",
        "desired_goal",
        "observation",
    ]

    planner = [
        "planner.horizon=2",
        "planner.beam_width=3",
        "planner.context_transitions=1",
        "eval.episodes=3",
        "eval.num_envs=2",
        "eval.max_episode_steps=10",
        "eval.progress=false",
        "device=cpu",
    ]
    evaluated = run_module(
        "trajectory_transformer.cli.evaluate",
        f"checkpoint={run / 'checkpoint.pt'}",
        *planner,
        f"hydra.run.dir={tmp_path / 'eval'}",
    )
    assert evaluated.returncode == 0, evaluated.stderr
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["lengths"] == [10, 10, 10]
    assert results["settings"]["env"] == "PointMaze_UMaze-v3"

    # The same checkpoint on an env of flat observations is one clear error.
    refused = run_module(
        "trajectory_transformer.cli.evaluate",
        f"checkpoint={run / 'checkpoint.pt'}",
        *planner,
        "eval.env_id=Pendulum-v1",
        f"hydra.run.dir={tmp_path / 'refused'}",
    )
    assert refused.returncode == 2
    assert "checkpoint Dict observations {achieved_goal: (2,)" in refused.stderr
    assert "env Box(3,) observations" in refused.stderr
    assert "Traceback" not in refused.stderr
