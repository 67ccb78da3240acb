"""The InvertedDoublePendulum suite's own controller: an LQR on MuJoCo's linearised model (what
every suite shares is in test_suites.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from trajectory_transformer.suites import collect, double_pendulum, lqr


def rollout(epsilon: float, seeds: np.ndarray) -> collect.Rollout:
    policy = double_pendulum.epsilon_random_expert(epsilon)
    return collect.rollout(
        double_pendulum.ENV_ID, policy, seeds, np.random.default_rng(0), num_envs=len(seeds)
    )


def test_the_lqr_stabilises_the_linearised_step():
    a, b = lqr.linearised_step(double_pendulum.ENV_ID)
    assert max(abs(np.linalg.eigvals(a))) > 1.05  # upright is unstable on its own
    closed = a - b @ double_pendulum.lqr_gain()
    assert max(abs(np.linalg.eigvals(closed))) < 0.99


def test_the_expert_stays_up_and_medium_falls_between_expert_and_random():
    seeds = np.arange(3000, 3008)
    expert = rollout(0.0, seeds)
    assert [len(r) for r in expert.rewards] == [1000] * len(seeds)
    assert not any(t.any() for t in expert.terminations)
    assert expert.returns.min() > 9000  # about 9.36 a step
    random = rollout(1.0, seeds)
    assert all(t[-1] for t in random.terminations) and random.returns.max() < 300
    medium = rollout(0.05, seeds)  # kicks five times as often as the dataset's: falls sooner
    assert any(t[-1] for t in medium.terminations)
    assert random.returns.mean() < medium.returns.mean() < expert.returns.mean()


def test_the_expert_reads_the_observation_as_gymnasium_writes_it():
    """At a pose set directly, the state the expert rebuilds from the observation is MuJoCo's."""
    env = gym.make(double_pendulum.ENV_ID).unwrapped
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    gain = double_pendulum.lqr_gain()
    for _ in range(10):
        qpos, qvel = rng.uniform(-0.3, 0.3, 3), rng.uniform(-2, 2, 3)
        env.set_state(qpos, qvel)
        action = double_pendulum.expert_action(env._get_obs()[None])
        expected = np.clip(-gain @ np.concatenate([qpos, qvel]), -1, 1)
        np.testing.assert_allclose(action[0], expected, rtol=1e-5, atol=1e-6)
        assert action.shape == (1, 1) and action.dtype == np.float32
