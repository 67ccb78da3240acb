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
