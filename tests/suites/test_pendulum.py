"""The Pendulum suite's own controllers: the energy swing-up + LQR expert and its epsilon-random
variants (what every suite shares is in test_suites.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from trajectory_transformer.suites import collect, pendulum


def test_expert_beats_medium_beats_random():
    seeds = np.arange(1000, 1012)
    returns = {
        name: collect.rollout(
            pendulum.ENV_ID,
            pendulum.epsilon_random_expert(epsilon),
            seeds,
            np.random.default_rng(0),
        ).returns.mean()
        for name, epsilon in [("expert", 0.0), ("medium", pendulum.MEDIUM_EPSILON), ("random", 1.0)]
    }
    assert returns["expert"] > returns["medium"] + 200 > returns["random"] + 200 + 100
    assert returns["expert"] > -250


def test_expert_action_bounds_and_balance():
    angles = np.linspace(-np.pi, np.pi, 101)
    velocities = np.linspace(-8, 8, 101)
    a, v = np.meshgrid(angles, velocities)
    obs = np.stack([np.cos(a).ravel(), np.sin(a).ravel(), v.ravel()], axis=1)
    actions = pendulum.expert_action(obs)
    assert actions.shape == (len(obs), 1) and actions.dtype == np.float32
    assert np.abs(actions).max() <= 2.0
    # Started close to upright, the expert holds it there at almost no cost.
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=0, options={"x_init": 0.2, "y_init": 0.5})
    total = 0.0
    for _ in range(200):
        obs, reward, *_ = env.step(pendulum.expert_action(obs[None])[0])
        total += reward
    assert total > -5.0
    assert obs[0] > 0.999


def test_medium_replay_epsilon_falls_from_random_to_medium():
    """Each medium-replay episode has its own epsilon: the first acts at random, the last as
    the medium policy, so the returns rise along the dataset."""
    replay = pendulum.episodes_of("medium-replay", 40, 0)
    first, last = replay.returns[:10].mean(), replay.returns[-10:].mean()
    assert last > first + 200
