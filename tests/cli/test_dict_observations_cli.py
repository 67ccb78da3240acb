"""A Minari dataset of Dict observations (PointMaze's keys, made with
`minari.create_dataset_from_buffers`) trains and plans end to end through tt-train and
tt-eval, the evaluation env flattened as the dataset was."""

from __future__ import annotations

import json

import gymnasium as gym
import gymnasium_robotics
import torch
from conftest import TINY_TRAINING, run_module, synthetic_maze_dataset

gym.register_envs(gymnasium_robotics)


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
