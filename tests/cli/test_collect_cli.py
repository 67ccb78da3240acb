import minari
from conftest import run_module


def tt_collect(*overrides):
    return run_module("trajectory_transformer.cli.collect", *overrides)


def test_collect_builds_a_named_embedded_dataset():
    result = tt_collect("datasets=[pendulum/random-v0]", "episodes=6")
    assert result.returncode == 0, result.stderr
    assert "pendulum/random-v0: 6 episodes, 1200 steps" in result.stdout
    assert "normalised score" in result.stdout
    assert "pendulum/random-v0" in minari.list_local_datasets()


def test_collect_refuses_other_ids():
    result = tt_collect("datasets=[mujoco/hopper/medium-v0]")
    assert result.returncode == 2
    assert "pendulum/medium-v0" in result.stderr and "Traceback" not in result.stderr


def test_collect_builds_a_maze_offline_and_reports_its_behaviour_policy():
    """A PointMaze dataset builds with gymnasium-robotics alone (no download); its episodes
    each end at a random goal, so the line also gives the behaviour policy's evaluation score."""
    result = tt_collect("datasets=[pointmaze/umaze-v0]", "episodes=2")
    assert result.returncode == 0, result.stderr
    assert "pointmaze/umaze-v0: 2 episodes" in result.stdout
    assert "behaviour policy in the evaluation env: return" in result.stdout
    dataset = minari.load_dataset("pointmaze/umaze-v0")
    assert set(dataset.observation_space.spaces) == {"achieved_goal", "desired_goal", "observation"}
