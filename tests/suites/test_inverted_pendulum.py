"""The InvertedPendulum suite's own controllers: an LQR on MuJoCo's linearised model, and the
medium policy's controller of the pole alone (what every suite shares is in test_suites.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from trajectory_transformer.suites import collect, inverted_pendulum, lqr


def rollout(policy: collect.Policy, seeds: np.ndarray) -> collect.Rollout:
    return collect.rollout(
        inverted_pendulum.ENV_ID, policy, seeds, np.random.default_rng(0), num_envs=len(seeds)
    )


def test_the_lqr_stabilises_the_linearised_step_and_the_pole_gains_alone_do_not():
    a, b = lqr.linearised_step(inverted_pendulum.ENV_ID)
    assert max(abs(np.linalg.eigvals(a))) > 1.05  # upright is unstable on its own
    gain = inverted_pendulum.lqr_gain()
    assert max(abs(np.linalg.eigvals(a - b @ gain))) < 0.99
    # Without the cart's gains the cart's position is not fed back: an eigenvalue at 1.
    assert max(abs(np.linalg.eigvals(a - b @ inverted_pendulum.pole_gain()))) >= 1 - 1e-6


def test_the_expert_stays_up_the_medium_policy_falls_later_than_random():
    seeds = np.arange(3000, 3006)
    expert = rollout(inverted_pendulum.epsilon_random_expert(0.0), seeds)
    assert [len(r) for r in expert.rewards] == [1000] * len(seeds)
    assert not any(t.any() for t in expert.terminations)
    pole = rollout(inverted_pendulum.medium_policy(noise=0.0), seeds)
    assert all(t[-1] for t in pole.terminations)  # the cart reaches the end of its rail
    assert min(len(r) for r in pole.rewards) > 100 and max(len(r) for r in pole.rewards) < 1000
    random = rollout(inverted_pendulum.epsilon_random_expert(1.0), seeds)
    medium = rollout(inverted_pendulum.medium_policy(), seeds)
    assert all(t[-1] for t in medium.terminations)
    assert random.returns.mean() < medium.returns.mean() < expert.returns.mean()


def test_the_controllers_read_the_observation_as_the_state():
    env = gym.make(inverted_pendulum.ENV_ID).unwrapped
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    gain = inverted_pendulum.lqr_gain()
    for _ in range(10):
        qpos, qvel = rng.uniform(-0.1, 0.1, 2), rng.uniform(-1, 1, 2)
        env.set_state(qpos, qvel)
        obs = env._get_obs()[None]
        state = np.concatenate([qpos, qvel])
        expected = np.clip(-gain @ state, -3, 3)
        np.testing.assert_allclose(
            inverted_pendulum.expert_action(obs)[0], expected, rtol=1e-5, atol=1e-6
        )
        pole = np.clip(-(gain[0, 1] * qpos[1] + gain[0, 3] * qvel[1]), -3, 3)
        np.testing.assert_allclose(
            inverted_pendulum.pole_action(obs)[0], [pole], rtol=1e-5, atol=1e-6
        )
        assert inverted_pendulum.expert_action(obs).dtype == np.float32
