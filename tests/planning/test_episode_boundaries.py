"""The Python API's loop across episode boundaries, under each of gymnasium's autoreset modes:
the planner's context holds the transitions of the running episode and nothing else."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import tiny_gpt

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.planning import BeamPlanner

OBS, ACT = 3, 1  # Pendulum-v1
T = OBS + ACT + 2
LENGTH = 4  # steps per episode


def planner() -> BeamPlanner:
    data = np.random.default_rng(0).normal(size=(400, T))
    model = tiny_gpt(OBS, ACT, 16, sequence_transitions=4, value_inputs=True)
    discretizer = Discretizer.fit(data, 16)
    model.set_value_inputs(discretizer.values, *discretizer.value_normalisation())
    return BeamPlanner(model, discretizer, horizon=1, beam_width=2, context_transitions=3, seed=0)


def stored(agent: BeamPlanner, env: int) -> torch.Tensor:
    """The real transitions (n, T) env `env` keeps as its context."""
    kept = int(agent._history[env])
    K = agent.config.context_transitions
    return agent._context_values[env, K - kept :]


@pytest.mark.parametrize("mode", list(gym.vector.AutoresetMode))
def test_the_context_holds_the_running_episode_only(mode) -> None:
    """Two envs through two episodes each, in the loop a user writes: the context after each
    step holds exactly that episode's transitions (observation, action played, reward), and a
    new episode starts empty, without the last observation of the one before."""
    envs = gym.make_vec(
        "Pendulum-v1",
        num_envs=2,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": mode},
        max_episode_steps=LENGTH,
    )
    agent = planner()
    agent.reset(envs.num_envs, autoreset_mode=envs.metadata["autoreset_mode"])
    observations, _ = envs.reset(seed=0)
    episode: list[list[np.ndarray]] = [[], []]  # each env's transitions seen so far
    finished = np.zeros(2, dtype=int)
    resetting = np.zeros(2, dtype=bool)  # NEXT_STEP: this step only resets the env
    while finished.min() < 2:
        actions = agent.act(observations)
        next_observations, rewards, terminated, truncated, _ = envs.step(actions)
        dones = terminated | truncated
        agent.observe(rewards, dones)
        for env in range(2):
            if resetting[env]:  # the action was ignored, the reward is 0: nothing happened
                assert rewards[env] == 0 and not dones[env]
            else:
                real = np.r_[observations[env], actions[env], rewards[env]]
                episode[env].append(real.astype(np.float32))
            if dones[env]:
                finished[env] += 1
                assert len(episode[env]) == LENGTH
                episode[env] = []
            expected = episode[env][-3:]
            kept = stored(agent, env)
            assert len(kept) == len(expected), (mode, env, finished)
            for row, transition in zip(kept, expected, strict=True):
                assert torch.equal(row[:-1], torch.as_tensor(transition))
        resetting = dones if mode == gym.vector.AutoresetMode.NEXT_STEP else np.zeros(2, bool)
        if mode == gym.vector.AutoresetMode.DISABLED and dones.any():
            next_observations, _ = envs.reset(options={"reset_mask": dones})
        observations = next_observations
    envs.close()


def test_an_unknown_autoreset_mode_is_refused_naming_the_modes() -> None:
    with pytest.raises(ValueError, match="autoreset_mode must be a gymnasium AutoresetMode"):
        planner().reset(2, autoreset_mode="sometimes")
