"""A Dict env is flattened as the checkpoint's dataset was, or refused with what differs."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from trajectory_transformer.data.minari_source import DatasetInfo
from trajectory_transformer.evaluation import check_env_matches, make_vector_env
from trajectory_transformer.evaluation.envs import EnvMismatchError, flatten_as_trained

LAYOUT = (("achieved_goal", (2,)), ("desired_goal", (2,)), ("observation", (3,)))


class GoalEnv(gym.Env):
    """A Dict-observation env whose keys are listed in `order` (gymnasium sorts a mapping,
    keeps a list of pairs as given)."""

    def __init__(self, order=("achieved_goal", "desired_goal", "observation"), sizes=None):
        sizes = sizes or {"achieved_goal": 2, "desired_goal": 2, "observation": 3}
        self.observation_space = gym.spaces.Dict(
            [(key, gym.spaces.Box(-np.inf, np.inf, (sizes[key],))) for key in order]
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, False, False, {}

    def _obs(self):
        return {
            key: np.full(space.shape, i + 1.0)
            for i, (key, space) in enumerate(self.observation_space.items())
        }


def info(layout=LAYOUT) -> DatasetInfo:
    dim = 7 if layout is not None else 3
    return DatasetInfo(
        "test/goals-v0", None, "GoalEnv", dim, 2, [-1.0] * 2, [1.0] * 2, None, None, 1, 10, layout
    )


def test_a_dict_env_is_flattened_in_the_checkpoints_key_order():
    env = flatten_as_trained(info(), GoalEnv())
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, [1, 1, 2, 2, 3, 3, 3])
    assert env.observation_space.shape == (7,)


def test_a_vector_env_of_dict_envs_fits_the_checkpoint(monkeypatch):
    monkeypatch.setattr(DatasetInfo, "make_env", lambda self, **kwargs: GoalEnv())
    env = make_vector_env(info(), 2)
    check_env_matches(info(), env)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 7)
    env.close()


def test_the_same_keys_in_another_order_are_refused():
    reordered = GoalEnv(order=("observation", "achieved_goal", "desired_goal"))
    with pytest.raises(EnvMismatchError) as error:
        flatten_as_trained(info(), reordered)
    message = str(error.value)
    assert "checkpoint Dict observations {achieved_goal: (2,), desired_goal: (2,)" in message
    assert "env Dict observations {observation: (3,), achieved_goal: (2,)" in message
    assert "the same keys in another order" in message


@pytest.mark.parametrize(
    ("env", "found"),
    [
        (GoalEnv(sizes={"achieved_goal": 2, "desired_goal": 2, "observation": 4}), "(4,)"),
        (GoalEnv(order=("achieved_goal", "observation")), "env Dict observations {achieved_goal"),
        (gym.make("Pendulum-v1"), "env Box(3,) observations"),
    ],
)
def test_other_keys_shapes_or_a_flat_env_are_one_error(env, found):
    with pytest.raises(EnvMismatchError, match="does not fit") as error:
        flatten_as_trained(info(), env)
    assert found in str(error.value) and "another order" not in str(error.value)


def test_a_flat_checkpoint_refuses_a_dict_env_and_keeps_a_box_env():
    flat = dataclasses.replace(info(None), observation_dim=3)
    with pytest.raises(EnvMismatchError, match=r"checkpoint \(3,\) Box observations, env Dict"):
        flatten_as_trained(flat, GoalEnv())
    pendulum = gym.make("Pendulum-v1")
    assert flatten_as_trained(flat, pendulum) is pendulum
