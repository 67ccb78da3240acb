"""The Reacher suite's own controller: inverse kinematics + PD on gymnasium's arm (what every
suite shares is in test_suites.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from trajectory_transformer.suites import collect, reacher


def mean_return(epsilon: float, seeds: np.ndarray) -> float:
    policy = reacher.epsilon_random_expert(epsilon)
    rollout = collect.rollout(reacher.ENV_ID, policy, seeds, np.random.default_rng(0))
    return float(rollout.returns.mean())


def test_fingertip_model_matches_the_environment():
    """The controller's arm (link lengths, observation layout) is gymnasium's: at any pose, its
    forward kinematics minus the target is the observed fingertip-minus-target vector.

    Poses are set directly: after a physics step the observed vector lags the joint angles by
    one 10 ms substep (MuJoCo computes body positions before integrating)."""
    env = gym.make("Reacher-v5").unwrapped
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        qpos = np.concatenate([rng.uniform(-np.pi, np.pi, 1), rng.uniform(-3, 3, 1)])
        qpos = np.concatenate([qpos, rng.uniform(-0.2, 0.2, 2)])  # and a target
        env.set_state(qpos, np.zeros(4))
        obs = env._get_obs()
        tip = reacher.fingertip(np.array([qpos[0]]), np.array([qpos[1]]))[0]
        np.testing.assert_allclose(tip - obs[4:6], obs[8:10], atol=1e-9)
        np.testing.assert_allclose(obs[4:6], qpos[2:], atol=1e-9)


def test_expert_beats_medium_beats_random():
    seeds = np.arange(2000, 2012)
    expert = mean_return(0.0, seeds)
    medium = mean_return(reacher.MEDIUM_EPSILON, seeds)
    random = mean_return(1.0, seeds)
    # Typical values: -3.6, -24 and -43; the margins leave room for any CPU's arithmetic.
    assert expert > -6.0
    assert random < -30.0
    assert expert > medium + 10 and medium > random + 10


def test_expert_holds_the_fingertip_on_the_target():
    env = gym.make("Reacher-v5")
    obs, _ = env.reset(seed=7)
    for _ in range(50):
        obs, *_ = env.step(reacher.expert_action(obs[None])[0])
    assert np.linalg.norm(obs[8:10]) < 0.02  # the target sphere's radius is 0.009
    assert np.abs(obs[6:8]).max() < 0.5


def test_expert_action_bounds():
    rng = np.random.default_rng(0)
    angles = rng.uniform(-3.0, 3.0, (500, 2))
    target = rng.uniform(-0.3, 0.3, (500, 2))
    velocity = rng.uniform(-30, 30, (500, 2))
    tip = reacher.fingertip(angles[:, 0], angles[:, 1])
    obs = np.concatenate([np.cos(angles), np.sin(angles), target, velocity, tip - target], axis=1)
    actions = reacher.expert_action(obs)
    assert actions.shape == (500, 2) and actions.dtype == np.float32
    assert np.isfinite(actions).all() and np.abs(actions).max() <= 1.0
