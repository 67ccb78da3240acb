"""Embedded offline dataset for ``Reacher-v5``, built locally by a scripted controller.

``reacher/medium-v0`` is generated on demand, like the Pendulum suite
(:mod:`trajectory_transformer.data.pendulum`), and written with
:func:`minari.create_dataset_from_buffers`. The episodes are stepped by gymnasium's own
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
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import minari
import numpy as np
from minari.data_collector import EpisodeBuffer

from trajectory_transformer.data import local_datasets
from trajectory_transformer.data.scores import normalized_score

__all__ = [
    "EMBEDDED_DATASETS",
    "ENV_ID",
    "MEDIUM_EPSILON",
    "EpsilonRandomExpert",
    "Rollout",
    "build_embedded_dataset",
    "expert_action",
    "fingertip",
    "is_embedded",
    "random_action",
    "reference_scores",
    "rollout",
]

ENV_ID = "Reacher-v5"
DEFAULT_EPISODES = 500
MEDIUM_EPSILON = 0.45
"""Probability of a uniform random action in the medium policy (normalised score about 50)."""
REFERENCE_EPISODES = 100

EMBEDDED_DATASETS: dict[str, str] = {
    "reacher/medium-v0": (
        f"Reacher-v5, inverse-kinematics + PD expert taking uniform random actions with "
        f"probability {MEDIUM_EPSILON}."
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

# Disjoint ranges of reset seeds: one block of 10M per base seed, 1M per dataset kind.
_SEED_BLOCK = 10_000_000
_KIND_BLOCK = 1_000_000
_KIND_OFFSET = {"medium": 1, "evaluation": 9}


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


def random_action(n: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, 2)`` float32 actions drawn uniformly from ``[-1, 1]``."""
    return rng.uniform(-1.0, 1.0, size=(n, _ACT_DIM)).astype(np.float32)


Policy = Callable[[np.ndarray, np.random.Generator], np.ndarray]
"""A batched behaviour policy: ``(obs (N, 10), rng) -> actions (N, 2)``."""


@dataclass(frozen=True)
class EpsilonRandomExpert:
    """The expert, replaced by a uniform random action with probability ``epsilon`` each step.

    0 is the expert, 1 the uniform random policy. The generator is consumed identically for
    every epsilon.
    """

    epsilon: float

    def __call__(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = len(obs)
        explore = rng.random(n) < self.epsilon
        noise = random_action(n, rng)
        return np.where(explore[:, None], noise, expert_action(obs))


# ----------------------------------------------------------------------------- rollouts


@dataclass(frozen=True)
class Rollout:
    """``N`` complete episodes of equal length ``T`` (arrays are read-only)."""

    seeds: np.ndarray  # (N,) reset seeds
    observations: np.ndarray  # (N, T + 1, 10) float64, as the environment returns them
    actions: np.ndarray  # (N, T, 2) float32
    rewards: np.ndarray  # (N, T) float64
    terminations: np.ndarray  # (N, T) bool
    truncations: np.ndarray  # (N, T) bool

    @property
    def returns(self) -> np.ndarray:
        return self.rewards.sum(axis=1)

    def buffers(self, first_id: int = 0) -> list[EpisodeBuffer]:
        return local_datasets.episode_buffers(self, first_id)


def rollout(policy: Policy, seeds: np.ndarray, rng: np.random.Generator) -> Rollout:
    """Run one ``Reacher-v5`` episode per reset seed, all in lockstep, until truncation.

    Stepped by gymnasium's own environments (a synchronous vector env, one env per seed); the
    policy sees the batch of observations.
    """
    seeds = np.asarray(seeds, dtype=np.int64)
    n = len(seeds)
    steps = gym.spec(ENV_ID).max_episode_steps
    observations = np.empty((n, steps + 1, _OBS_DIM), dtype=np.float64)
    actions = np.empty((n, steps, _ACT_DIM), dtype=np.float32)
    rewards = np.empty((n, steps), dtype=np.float64)
    terminations = np.empty((n, steps), dtype=bool)
    truncations = np.empty((n, steps), dtype=bool)
    env = gym.make_vec(ENV_ID, num_envs=n, vectorization_mode="sync")
    try:
        observations[:, 0], _ = env.reset(seed=[int(seed) for seed in seeds])
        for t in range(steps):
            actions[:, t] = policy(observations[:, t], rng)
            step = env.step(actions[:, t])
            observations[:, t + 1], rewards[:, t], terminations[:, t], truncations[:, t], _ = step
    finally:
        env.close()
    # Every episode ends together, by the time limit: nothing was auto-reset inside the loop.
    if not (truncations[:, -1].all() and not terminations.any() and not truncations[:, :-1].any()):
        raise RuntimeError(
            f"{ENV_ID} episodes were expected to run {steps} steps and end by truncation; "
            "has the environment changed?"
        )

    result = Rollout(seeds, observations, actions, rewards, terminations, truncations)
    for array in (seeds, observations, actions, rewards, terminations, truncations):
        array.flags.writeable = False
    return result


def _seeds(kind: str, episodes: int, seed: int) -> np.ndarray:
    if not 0 < episodes <= _KIND_BLOCK:
        raise ValueError(f"episodes must be in [1, {_KIND_BLOCK}], got {episodes}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    start = seed * _SEED_BLOCK + _KIND_OFFSET[kind] * _KIND_BLOCK
    return np.arange(start, start + episodes, dtype=np.int64)


# ----------------------------------------------------------------------------- reference scores


@functools.lru_cache(maxsize=16)
def reference_scores(seed: int = 0, episodes: int = REFERENCE_EPISODES) -> tuple[float, float]:
    """``(ref_min_score, ref_max_score)``: mean returns of the uniform random policy and of the
    expert over ``episodes`` seeded evaluation episodes (the same start states for both; seeds
    disjoint from the dataset's). Cached per process."""
    seeds = _seeds("evaluation", episodes, seed)
    rng = np.random.default_rng([seed, _KIND_OFFSET["evaluation"]])
    random_returns = rollout(EpsilonRandomExpert(1.0), seeds, rng).returns
    expert_returns = rollout(EpsilonRandomExpert(0.0), seeds, rng).returns
    return float(random_returns.mean()), float(expert_returns.mean())


# ----------------------------------------------------------------------------- datasets

_ALGORITHM_NAMES = {"reacher/medium-v0": f"epsilon-random({MEDIUM_EPSILON}) IK+PD"}
_EPSILONS = {"reacher/medium-v0": ("medium", MEDIUM_EPSILON)}


def is_embedded(dataset_id: str) -> bool:
    """Whether ``dataset_id`` is one of the datasets this module can build."""
    return dataset_id in EMBEDDED_DATASETS


def build_embedded_dataset(
    dataset_id: str, *, overwrite: bool = False, episodes: int = DEFAULT_EPISODES, seed: int = 0
) -> minari.MinariDataset:
    """Build (or load) an embedded Reacher dataset in the local Minari folder.

    Args:
        dataset_id: one of :data:`EMBEDDED_DATASETS`.
        overwrite: delete and rebuild the dataset if it exists locally; otherwise an existing
            dataset is loaded and returned as it is (whatever ``episodes`` and ``seed`` built it).
        episodes: episodes of 50 steps.
        seed: base seed of reset seeds, action noise and the reference scores.
    """
    if not is_embedded(dataset_id):
        raise ValueError(
            f"unknown embedded dataset {dataset_id!r}; known ids: {', '.join(EMBEDDED_DATASETS)}"
        )
    found = local_datasets.existing(dataset_id, overwrite)
    if found is not None:
        return found

    ref_min, ref_max = reference_scores(seed)
    kind, epsilon = _EPSILONS[dataset_id]
    rng = np.random.default_rng([seed, _KIND_OFFSET[kind]])
    episodes_rollout = rollout(EpsilonRandomExpert(epsilon), _seeds(kind, episodes, seed), rng)
    buffers = episodes_rollout.buffers()
    returns = episodes_rollout.returns
    steps = episodes_rollout.rewards.shape[1]
    score = float(normalized_score(returns.mean(), ref_min, ref_max))
    description = (
        f"{EMBEDDED_DATASETS[dataset_id]} {len(buffers)} episodes of {steps} steps, built by "
        f"trajectory_transformer.data.reacher (seed {seed}). Mean return {returns.mean():.1f}, "
        f"normalised score {score:.1f} (ref_min_score {ref_min:.1f}: uniform random policy; "
        f"ref_max_score {ref_max:.1f}: inverse-kinematics + PD expert; "
        f"{REFERENCE_EPISODES} evaluation episodes each)."
    )

    return local_datasets.write(
        dataset_id,
        buffers,
        ENV_ID,
        _ALGORITHM_NAMES[dataset_id],
        (ref_min, ref_max),
        REFERENCE_EPISODES,
        description,
        namespace_description="Reacher-v5 datasets built by trajectory_transformer.",
    )
