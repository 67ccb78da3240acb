"""Embedded offline dataset for ``InvertedDoublePendulum-v5``, a terminating task built by a
scripted controller.

``inverteddoublependulum/medium-v0`` is generated on demand, like the Pendulum and Reacher
suites, by the suites' shared machinery (:mod:`trajectory_transformer.suites.collect`). The
episodes are stepped by gymnasium's own ``InvertedDoublePendulum-v5`` (MuJoCo; a synchronous
vector env of ``NUM_ENVS`` envs, each starting the next reset seed as soon as its episode ends).
An episode ends by **termination** when the tip of the second pole falls to a height of 1 or
less (upright it is at 1.2), or by **truncation** at the 1,000-step time limit; Minari stores
the two flags apart. The data is what gymnasium and MuJoCo compute on the machine that builds
it, so returns may differ between CPUs in the last digits.

Observations (9, float64): the cart's position, ``sin`` and ``cos`` of the two hinge angles
(the second relative to the first), the three joint velocities (clipped to +-10) and the
slider's constraint force. The action (1, in ``[-1, 1]``) is the cart's force divided by the
motor's gear of 500. Each step (0.05 s) pays 10 for staying up, less the tip's distance
penalty (about 0.64 upright) and a small velocity penalty: about 9.36 per step, 9,360 for a
whole episode.

Policies:

* **expert** (:func:`expert_action`): a discrete-time LQR on the state ``(x, theta1, theta2,
  x', theta1', theta2')``, its gain computed once from MuJoCo's own model, linearised about
  the upright rest by central differences over one env step (:func:`lqr_gain`,
  :mod:`~trajectory_transformer.suites.lqr`). It stays up
  for the whole episode from every start: mean return about 9,360.
* **random**: actions drawn uniformly from ``[-1, 1]`` (falls within about 6 steps, mean return
  about 48).
* **medium**: epsilon-random expert, each step a uniform random action with probability
  ``MEDIUM_EPSILON`` (0.01). A random action is a kick of up to 500 N for 0.05 s, which the
  controller often cannot catch, so most episodes end by a fall, at any time: with the
  defaults (seed 0) 220 episodes, 190 of them falls, 100,387 transitions, a mean return of
  4,259.0, a normalised score of 45.2. An agent that never kicks scores 100.

Reference scores, stored in the dataset's metadata: ``ref_min_score`` is the mean return of the
uniform random policy and ``ref_max_score`` that of the expert, each over 100 seeded
evaluation episodes (``SUITE.reference_scores``).
"""

from __future__ import annotations

import functools

import numpy as np

from trajectory_transformer.suites import collect, lqr

__all__ = [
    "DATASETS",
    "ENV_ID",
    "MEDIUM_EPSILON",
    "SUITE",
    "epsilon_random_expert",
    "expert_action",
    "lqr_gain",
    "random_action",
]

ENV_ID = "InvertedDoublePendulum-v5"
MEDIUM_EPSILON = 0.01
"""Probability of a uniform random action in the medium policy (normalised score about 45)."""
TRANSITIONS = 100_000
"""The dataset is collected until it holds at least this many transitions."""
NUM_ENVS = 25  # episodes stepped together in one vector env
REFERENCE_EPISODES = 100

DATASETS = {
    "inverteddoublependulum/medium-v0": collect.Dataset(
        f"InvertedDoublePendulum-v5, an LQR expert taking uniform random actions with "
        f"probability {MEDIUM_EPSILON}.",
        f"epsilon-random({MEDIUM_EPSILON}) LQR",
        ("medium",),
    ),
}

# LQR weights on (x, theta1, theta2, x', theta1', theta2') and on the action: the angles
# matter most; the cart may drift within its rail of +-1.
_STATE_WEIGHTS = (1.0, 10.0, 10.0, 0.1, 0.1, 0.1)
_ACTION_WEIGHT = 1.0
_OBS_DIM = 9


# ----------------------------------------------------------------------------- controllers


@functools.cache
def lqr_gain() -> np.ndarray:
    """``(1, 6)`` gain ``K`` of the discrete-time LQR, ``u = -K z``, on MuJoCo's linearised
    step (:mod:`~trajectory_transformer.suites.lqr`)."""
    a, b = lqr.linearised_step(ENV_ID)
    return lqr.discrete_gain(a, b, _STATE_WEIGHTS, _ACTION_WEIGHT)


def expert_action(obs: np.ndarray) -> np.ndarray:
    """The LQR's actions for a batch of observations.

    Args:
        obs: ``(N, 9)`` InvertedDoublePendulum-v5 observations.

    Returns:
        ``(N, 1)`` float32 actions in ``[-1, 1]``.
    """
    obs = np.asarray(obs, dtype=np.float64).reshape(-1, _OBS_DIM)
    angles = np.arctan2(obs[:, 1:3], obs[:, 3:5])
    state = np.concatenate([obs[:, :1], angles, obs[:, 5:8]], axis=1)
    return np.clip(-state @ lqr_gain().T, -1.0, 1.0).astype(np.float32)


random_action = collect.UniformRandom(1)
"""``(n, rng) -> (n, 1)`` float32 actions drawn uniformly from ``[-1, 1]``."""


def epsilon_random_expert(epsilon: float) -> collect.EpsilonRandomExpert:
    """The expert, replaced by a uniform random action with probability ``epsilon`` each step;
    0 is the expert, 1 the uniform random policy."""
    return collect.EpsilonRandomExpert(expert_action, random_action, epsilon)


SUITE = collect.terminating_suite(
    ENV_ID,
    DATASETS,
    {"medium": epsilon_random_expert(MEDIUM_EPSILON)},
    epsilon_random_expert(1.0),
    epsilon_random_expert(0.0),
    expert_name="LQR expert",
    builder=__name__,
    transitions=TRANSITIONS,
    num_envs=NUM_ENVS,
    reference_episodes=REFERENCE_EPISODES,
)
