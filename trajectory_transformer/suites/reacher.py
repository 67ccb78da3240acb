"""Embedded offline dataset for ``Reacher-v5``, built locally by a scripted controller.

``reacher/medium-v0`` is generated on demand, like the Pendulum suite
(:mod:`trajectory_transformer.suites.pendulum`), by the suites' shared machinery
(:mod:`trajectory_transformer.suites.collect`). The episodes are stepped by gymnasium's own
``Reacher-v5`` (MuJoCo; a synchronous vector env, one distinct reset seed per episode), 50 steps
each, ending by truncation under the environment's time limit; Reacher never terminates. The data
is what gymnasium and MuJoCo compute on the machine that builds it, so returns may differ between
CPUs in the last digits.

Observations (10, float64): ``cos q0, cos q1, sin q0, sin q1`` of the two joint angles, the
target's ``x, y``, the joint velocities ``q0', q1'`` and the fingertip-minus-target vector. Actions
(2, in ``[-1, 1]``) are the joint torques divided by the motors' gear of 200. The reward is
``-|fingertip - target| - |action|^2`` per step. After a step, the fingertip vector (and the
reward's distance) is that of the pose one 10 ms physics substep earlier than the joint angles:
MuJoCo computes body positions before integrating. The expert reads the joint angles and the
target only.

Policies:

* **expert** (:func:`expert_action`): inverse kinematics plus a joint-space PD controller, no
  learning. The arm has two links of 0.1 and 0.11 (``reacher.xml``), so the elbow angle that puts
  the fingertip on a target at distance ``r`` from the base follows from the law of cosines, with
  two mirror solutions (elbow left or right); the controller takes the one nearer the current
  joint angles (the shoulder error wrapped to ``[-pi, pi]``, the elbow kept inside its +-3 rad
  range) and commands ``clip(0.3 * (q_target - q) - 0.05 q', -1, 1)``. The gains are small because
  the quadratic action cost dominates: an action of 1 costs as much per step as being 1 m off, and
  the motors accelerate the joints by about 4 rad/s per step at full action. Mean return about
  -3.6 over random starts, better than the environment's ``reward_threshold`` of -3.75.
* **random**: actions drawn uniformly from ``[-1, 1]^2`` (mean return about -43, two thirds of it
  the action cost).
* **medium**: epsilon-random expert, each step a uniform random action with probability 0.45,
  otherwise the expert's. Of its return of about -24, the action cost is about -18.5 (the
  expert's -1.1, random's -33) and the distance about -5.4 (expert -2.6, random -9.8): it heads
  for the target but is knocked a few centimetres off it (median final distance 6 cm, the
  expert's under 1 mm).

With the defaults (500 episodes, seed 0) the reference scores are -43.1 (random) and -3.7
(expert), and ``reacher/medium-v0`` (25,000 transitions) has a mean return of -23.6, a normalised
score of 49.6. On two CPU cores it builds in about 10 s (reference scores included; most of it
gymnasium's per-step overhead, MuJoCo itself takes 1.4 s), and
``tt-collect 'datasets=[reacher/medium-v0]'`` takes about 16 s in all.

Reference scores, stored in the dataset's metadata: ``ref_min_score`` is the mean return of the
uniform random policy and ``ref_max_score`` that of the expert, each over 100 seeded evaluation
episodes (see :func:`reference_scores`). The normalised score of a return is
``100 * (return - ref_min) / (ref_max - ref_min)`` (D4RL scale). The dataset's description records
its policy, mean return and normalised score.
"""

from __future__ import annotations

import functools

import numpy as np

from trajectory_transformer.suites import collect

__all__ = [
    "DATASETS",
    "ENV_ID",
    "MEDIUM_EPSILON",
    "SUITE",
    "episodes_of",
    "epsilon_random_expert",
    "expert_action",
    "fingertip",
    "random_action",
    "reference_scores",
]

ENV_ID = "Reacher-v5"
DEFAULT_EPISODES = 500
MEDIUM_EPSILON = 0.45
"""Probability of a uniform random action in the medium policy (normalised score about 50)."""
REFERENCE_EPISODES = 100

DATASETS = {
    "reacher/medium-v0": collect.Dataset(
        f"Reacher-v5, inverse-kinematics + PD expert taking uniform random actions with "
        f"probability {MEDIUM_EPSILON}.",
        f"epsilon-random({MEDIUM_EPSILON}) IK+PD",
        ("medium",),
    ),
}

# The arm, from gymnasium's reacher.xml: link lengths and the elbow joint's range.
LINK_LENGTHS = (0.1, 0.11)
_ELBOW_LIMIT = 3.0
_ELBOW_MARGIN = 0.05  # aim inside the range: the joint limit would stop the arm short
# PD gains on the joint-angle error (rad) and the joint velocities (rad/s), tuned on the return.
_POSITION_GAIN = 0.3
_VELOCITY_GAIN = 0.05
_OBS_DIM = 10
_ACT_DIM = 2

# Each kind's block of reset seeds (see collect.play).
_KIND_OFFSET = {"medium": 1}
_EPSILON = {"medium": MEDIUM_EPSILON}


# ----------------------------------------------------------------------------- controllers


def _joint_angles(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.arctan2(obs[:, 2], obs[:, 0]), np.arctan2(obs[:, 3], obs[:, 1])


def fingertip(shoulder: np.ndarray, elbow: np.ndarray) -> np.ndarray:
    """``(N, 2)`` fingertip positions of the arm at joint angles ``shoulder``, ``elbow``."""
    first, second = LINK_LENGTHS
    return np.stack(
        [
            first * np.cos(shoulder) + second * np.cos(shoulder + elbow),
            first * np.sin(shoulder) + second * np.sin(shoulder + elbow),
        ],
        axis=1,
    )


def _joint_errors(obs: np.ndarray) -> np.ndarray:
    """``(N, 2)`` joint-angle changes that put the fingertip on the target (nearest solution)."""
    first, second = LINK_LENGTHS
    shoulder, elbow = _joint_angles(obs)
    target_x, target_y = obs[:, 4], obs[:, 5]
    cos_elbow = (target_x**2 + target_y**2 - first**2 - second**2) / (2 * first * second)
    # Targets out of reach (or nearer the base than the limit allows) get the closest pose.
    bend = np.minimum(np.arccos(np.clip(cos_elbow, -1.0, 1.0)), _ELBOW_LIMIT - _ELBOW_MARGIN)
    candidates = []
    for goal_elbow in (bend, -bend):
        goal_shoulder = np.arctan2(target_y, target_x) - np.arctan2(
            second * np.sin(goal_elbow), first + second * np.cos(goal_elbow)
        )
        # The shoulder turns freely (take the short way round); the elbow cannot wrap.
        shoulder_error = (goal_shoulder - shoulder + np.pi) % (2 * np.pi) - np.pi
        candidates.append(np.stack([shoulder_error, goal_elbow - elbow], axis=1))
    first_is_nearer = np.abs(candidates[0]).sum(axis=1) <= np.abs(candidates[1]).sum(axis=1)
    return np.where(first_is_nearer[:, None], candidates[0], candidates[1])


def expert_action(obs: np.ndarray) -> np.ndarray:
    """Inverse kinematics + joint-space PD actions for a batch of observations.

    Args:
        obs: ``(N, 10)`` Reacher-v5 observations.

    Returns:
        ``(N, 2)`` float32 actions in ``[-1, 1]``.
    """
    obs = np.asarray(obs, dtype=np.float64).reshape(-1, _OBS_DIM)
    command = _POSITION_GAIN * _joint_errors(obs) - _VELOCITY_GAIN * obs[:, 6:8]
    return np.clip(command, -1.0, 1.0).astype(np.float32)


random_action = collect.UniformRandom(_ACT_DIM)
"""``(n, rng) -> (n, 2)`` float32 actions drawn uniformly from ``[-1, 1]``."""


def epsilon_random_expert(epsilon: float) -> collect.EpsilonRandomExpert:
    """The expert, replaced by a uniform random action with probability ``epsilon`` each step;
    0 is the expert, 1 the uniform random policy."""
    return collect.EpsilonRandomExpert(expert_action, random_action, epsilon)


# ----------------------------------------------------------------------------- episodes


def episodes_of(kind: str, episodes: int, seed: int) -> collect.Rollout:
    """The episodes of one policy kind (``medium``)."""
    policy = epsilon_random_expert(_EPSILON[kind])
    return collect.play(
        ENV_ID, policy, seed=seed, kind=_KIND_OFFSET[kind], episodes=episodes, fixed_length=True
    )


@functools.lru_cache(maxsize=16)
def reference_scores(seed: int = 0, episodes: int = REFERENCE_EPISODES) -> tuple[float, float]:
    """``(ref_min_score, ref_max_score)``: mean returns of the uniform random policy and of the
    expert over ``episodes`` seeded evaluation episodes. Cached per process."""
    random, expert = epsilon_random_expert(1.0), epsilon_random_expert(0.0)
    return collect.reference_scores(ENV_ID, random, expert, seed, episodes, fixed_length=True)


SUITE = collect.Suite(
    env_id=ENV_ID,
    datasets=DATASETS,
    episodes_of=episodes_of,
    reference_scores=reference_scores,
    describe=functools.partial(
        collect.describe_fixed_length, builder=__name__, expert="inverse-kinematics + PD expert"
    ),
    namespace_description="Reacher-v5 datasets built by trajectory_transformer.",
    default_episodes=DEFAULT_EPISODES,
    reference_episodes=REFERENCE_EPISODES,
)
