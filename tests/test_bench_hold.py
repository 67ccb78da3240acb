"""scripts/bench_hold.py: the plan calls of envs held at their goals."""

from __future__ import annotations

import json

import bench_hold  # scripts/, on pytest's path
import numpy as np
import pytest
import torch

from trajectory_transformer.cli.common import planner_settings
from trajectory_transformer.planning import BeamPlanner

SMALL = ["planner=maze-hold", "planner.horizon=2", "planner.beam_width=2"]


def test_every_env_starts_held_at_its_goal(maze_checkpoint):
    settings = planner_settings([f"checkpoint={maze_checkpoint}", *SMALL])
    planner = BeamPlanner.from_checkpoint(maze_checkpoint, **settings)
    observations = bench_hold.at_goal_observations(planner, 1)
    goals = planner.goals
    np.testing.assert_array_equal(observations[:, goals.desired], observations[:, goals.achieved])
    dims = slice(0, planner.observation_dim)
    tokens = planner.discretizer.encode(torch.as_tensor(observations), dims)
    assert planner._at_goal(tokens, settings["goal_radius"]).all()
    with pytest.raises(SystemExit, match="episode ends held, not 100"):
        bench_hold.at_goal_observations(planner, 100)


def test_the_rows_and_their_record(maze_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_hold, "RECORDS", tmp_path)
    argv = ["--checkpoint", str(maze_checkpoint), "--planner", *SMALL, "--tries", "3"]
    rows = bench_hold.main([*argv, "--envs", "1", "--reps", "2", "--record", "hold"])
    assert [row[0] for row in rows] == ["the search's own", "goal_tries=3"]
    assert rows[0][3] == "1.00x"
    assert all(float(row[1]) > 0 and row[3].endswith("x") for row in rows)
    record = json.loads((tmp_path / "hold.json").read_text())
    assert record["rows"] == rows
    assert record["note"].startswith("1 env, at the final observation")
    assert "medians of 2 plan calls" in record["note"]
    assert "the library of commit" in record["note"] or "trajectory-transformer" in record["note"]


def test_a_planner_without_a_hold_is_refused(maze_checkpoint):
    with pytest.raises(SystemExit, match=r"planner\.goal_radius"):
        bench_hold.main(["--checkpoint", str(maze_checkpoint), "--planner", "planner=maze"])
