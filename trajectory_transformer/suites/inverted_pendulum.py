"""Embedded offline dataset for ``InvertedPendulum-v5``, a terminating task built by a scripted
controller that balances the pole but lets the cart run away.

``invertedpendulum/medium-v0`` is generated on demand, like the other scripted suites, by the
suites' shared machinery (:mod:`trajectory_transformer.suites.collect`), in gymnasium's own
``InvertedPendulum-v5`` (MuJoCo; a synchronous vector env of ``NUM_ENVS`` envs). An episode
ends by **termination** when the pole leans more than 0.2 rad from upright, or by
**truncation** at the 1,000-step time limit; Minari stores the two flags apart. Each step
(0.04 s) pays 1 while the pole is up, so a return is the number of steps survived.

Observations (4, float64): the cart's position and the pole's angle, then their velocities.
The action (1, in ``[-3, 3]``) is the cart's force divided by the motor's gear of 100.

Policies:

* **expert** (:func:`expert_action`): a discrete-time LQR on the observation (which is the
  state ``(x, theta, x', theta')``), its gain computed once from MuJoCo's own model
  (:mod:`~trajectory_transformer.suites.lqr`). It stays up for the whole episode from every
  start: return 1,000.
* **random**: actions drawn uniformly from ``[-3, 3]`` (falls within about 5 steps).
* **medium** (:func:`medium_policy`): the expert's gains on the pole alone, those on the
  cart's position and speed set to 0, with Gaussian action noise of standard deviation
  ``MEDIUM_NOISE`` (0.6). It keeps the pole up while the cart drifts, and the pole falls when
  the cart reaches the end of its rail, after about 250 steps without noise and 161 on
  average with it (the dataset's episodes). Every episode ends by a fall. Staying up for
  longer takes what the data shows but the controller never does on purpose: pushing the cart
  back towards the middle.

Reference scores, stored in the dataset's metadata: ``ref_min_score`` is the mean return of the
uniform random policy and ``ref_max_score`` that of the expert, each over 100 seeded
evaluation episodes (``SUITE.reference_scores``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trajectory_transformer.suites import collect, lqr

__all__ = [
    "DATASETS",
    "ENV_ID",
    "MEDIUM_NOISE",
    "SUITE",
    "epsilon_random_expert",
    "expert_action",
    "lqr_gain",
    "medium_policy",
    "pole_action",
    "pole_gain",
    "random_action",
]

ENV_ID = "InvertedPendulum-v5"
MEDIUM_NOISE = 0.6
"""Standard deviation of the medium policy's Gaussian action noise (the action range is +-3)."""
TRANSITIONS = 100_000
"""The dataset is collected until it holds at least this many transitions."""
NUM_ENVS = 25  # episodes stepped together in one vector env
REFERENCE_EPISODES = 100
BOUND = 3.0  # the action's range

DATASETS = {
    "invertedpendulum/medium-v0": collect.Dataset(
        f"InvertedPendulum-v5, a controller of the pole alone (an LQR's pole gains, none on "
        f"the cart) with Gaussian action noise of std {MEDIUM_NOISE}.",
        f"pole-only LQR + N(0, {MEDIUM_NOISE}^2)",
        ("medium",),
    ),
}

# LQR weights on (x, theta, x', theta') and on the action.
_STATE_WEIGHTS = (1.0, 10.0, 0.1, 0.1)
_ACTION_WEIGHT = 1.0
_OBS_DIM = 4


@functools.cache
def lqr_gain() -> np.ndarray:
    """``(1, 4)`` gain ``K`` of the discrete-time LQR, ``u = -K z``, on MuJoCo's linearised
    step."""
    a, b = lqr.linearised_step(ENV_ID)
    return lqr.discrete_gain(a, b, _STATE_WEIGHTS, _ACTION_WEIGHT)


@functools.cache
def pole_gain() -> np.ndarray:
    """The LQR's gain with its entries on the cart's position and speed set to 0: the cart's
    position is no longer fed back."""
    return lqr_gain() * np.array([0.0, 1.0, 0.0, 1.0])


def _act(obs: np.ndarray, gain: np.ndarray) -> np.ndarray:
    obs = np.asarray(obs, dtype=np.float64).reshape(-1, _OBS_DIM)
    return np.clip(-obs @ gain.T, -BOUND, BOUND).astype(np.float32)


def expert_action(obs: np.ndarray) -> np.ndarray:
    """The LQR's ``(N, 1)`` float32 actions for ``(N, 4)`` observations."""
    return _act(obs, lqr_gain())


def pole_action(obs: np.ndarray) -> np.ndarray:
    """The actions of :func:`pole_gain`, the LQR without its gains on the cart."""
    return _act(obs, pole_gain())


random_action = collect.UniformRandom(1, BOUND)
"""``(n, rng) -> (n, 1)`` float32 actions drawn uniformly from ``[-3, 3]``."""


def epsilon_random_expert(epsilon: float) -> collect.EpsilonRandomExpert:
    """The expert, replaced by a uniform random action with probability ``epsilon`` each step;
    0 is the expert, 1 the uniform random policy (the reference scores' two ends)."""
    return collect.EpsilonRandomExpert(expert_action, random_action, epsilon)


@dataclass(frozen=True)
class NoisyController:
    """``controller``'s actions plus Gaussian noise of std ``noise``, clipped to the range."""

    controller: Callable[[np.ndarray], np.ndarray]
    noise: float

    def __call__(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        action = self.controller(obs)
        noise = rng.normal(0.0, self.noise, size=action.shape)
        return np.clip(action + noise, -BOUND, BOUND).astype(np.float32)


def medium_policy(noise: float = MEDIUM_NOISE) -> NoisyController:
    """The pole-only controller with Gaussian action noise of std ``noise``."""
    return NoisyController(pole_action, noise)


SUITE = collect.terminating_suite(
    ENV_ID,
    DATASETS,
    {"medium": medium_policy()},
    epsilon_random_expert(1.0),
    epsilon_random_expert(0.0),
    expert_name="LQR expert",
    builder=__name__,
    transitions=TRANSITIONS,
    num_envs=NUM_ENVS,
    reference_episodes=REFERENCE_EPISODES,
)
