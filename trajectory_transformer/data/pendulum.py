"""Embedded offline datasets for ``Pendulum-v1``, built locally by controllers shipped here.

Nothing is downloaded: every ``pendulum/*`` dataset is generated on demand with the behaviour
policies below and written with :func:`minari.create_dataset_from_buffers`. The episodes are
stepped by gymnasium's own ``Pendulum-v1`` (a synchronous vector env, one distinct reset seed
per episode), 200 steps each, ending by truncation under the environment's time limit.
Everything is deterministic given a base seed on a given machine; the data is what gymnasium
and numpy compute there, so returns may differ between CPUs in the last digits.

Policies (``u`` is the torque, bounded to ``[-2, 2]``):

* **expert** (:func:`expert_action`): energy-based swing-up plus a discrete-time LQR balance
  controller. With ``theta = 0`` upright the dynamics are ``theta'' = 15 sin(theta) + 3 u``, so
  ``E = theta'^2 / 2 + 15 cos(theta)`` equals 15 for the pendulum at rest upright and changes as
  ``dE/dt = 3 u theta'``. Far from upright the controller pumps energy towards 15 with
  ``u = clip((15 - E) sign(theta'), -2, 2)``; once the LQR cost-to-go ``x^T P x`` of
  ``x = (theta, theta')`` falls below 2 it switches to ``u = clip(-K x, -2, 2)``, where ``K``, ``P``
  solve the Riccati equation of the linearised, discretised (dt = 0.05) system under the
  environment's own cost weights (1, 0.1, 0.001). Mean return over random starts is about -150,
  close to the best achievable (starts hanging still at the bottom cost about -370, starts near
  upright almost nothing).
* **random**: torques drawn uniformly from ``[-2, 2]``.
* **medium**: epsilon-random expert, each step a uniform random torque with probability 0.7,
  otherwise the expert's.
* **medium-replay**: like a learner's replay buffer: episode ``i`` of ``n`` uses the
  epsilon-random expert with epsilon falling linearly from 1.0 (pure random) to 0.7 (medium).
* **medium-expert**: the medium episodes followed by the expert episodes (same policies and
  seeds as those two datasets, hence identical episodes).

With the defaults (500 episodes per policy, seed 0) the reference scores are -1271.2 (random)
and -157.0 (expert), and the datasets score:

==============  ===========  ================
dataset         mean return  normalised score
==============  ===========  ================
random              -1225.2               4.1
medium               -756.2              46.2
expert               -152.8             100.4
medium-replay        -967.7              27.2
medium-expert        -454.5              73.3
==============  ===========  ================

Reference scores, shared by all five datasets and stored in their metadata: ``ref_min_score`` is
the mean return of the uniform random policy and ``ref_max_score`` that of the expert, each over
100 seeded evaluation episodes (see :func:`reference_scores`). The normalised score of a return is
``100 * (return - ref_min) / (ref_max - ref_min)`` (D4RL scale). Each dataset's description
records its policy, mean return and normalised score.
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
    "is_embedded",
    "random_action",
    "reference_scores",
    "rollout",
]

ENV_ID = "Pendulum-v1"
MAX_TORQUE = 2.0
MEDIUM_EPSILON = 0.7
"""Probability of a uniform random torque in the medium policy."""
REPLAY_START_EPSILON = 1.0
"""Epsilon of the first medium-replay episode (falls linearly to ``MEDIUM_EPSILON``)."""
REFERENCE_EPISODES = 100

EMBEDDED_DATASETS: dict[str, str] = {
    "pendulum/random-v0": "Pendulum-v1, uniform random torques.",
    "pendulum/medium-v0": (
        f"Pendulum-v1, energy swing-up + LQR expert taking uniform random torques with "
        f"probability {MEDIUM_EPSILON}."
    ),
    "pendulum/expert-v0": "Pendulum-v1, energy-based swing-up + LQR balance controller.",
    "pendulum/medium-replay-v0": (
        f"Pendulum-v1, improving epsilon-random experts (epsilon {REPLAY_START_EPSILON} falling "
        f"to {MEDIUM_EPSILON}), like the replay buffer of a learner up to medium quality."
    ),
    "pendulum/medium-expert-v0": (
        "Pendulum-v1, the medium episodes followed by the expert episodes."
    ),
}

# The expert's model of Pendulum-v1: theta'' = 3 g / (2 l) sin(theta) + 3 / (m l^2) u, stepped
# by semi-implicit Euler.
_DT = 0.05
_GRAVITY_GAIN = 3 * 10.0 / (2 * 1.0)  # 15
_TORQUE_GAIN = 3.0 / (1.0 * 1.0**2)  # 3
_UPRIGHT_ENERGY = _GRAVITY_GAIN  # E at rest upright
_SWING_GAIN = 1.0
_BALANCE_REGION = 2.0  # switch to LQR when x^T P x is below this

# Disjoint ranges of reset seeds: one block of 10M per base seed, 1M per dataset kind.
_SEED_BLOCK = 10_000_000
_KIND_BLOCK = 1_000_000
_KIND_OFFSET = {"random": 0, "medium": 1, "expert": 2, "medium-replay": 3, "evaluation": 9}


# ----------------------------------------------------------------------------- controllers


@functools.lru_cache(maxsize=1)
def _lqr() -> tuple[np.ndarray, np.ndarray]:
    """Gain ``K`` (2,) and cost-to-go ``P`` (2, 2) of the discrete LQR balance controller."""
    a = np.array([[1 + _GRAVITY_GAIN * _DT**2, _DT], [_GRAVITY_GAIN * _DT, 1.0]])
    b = np.array([[_TORQUE_GAIN * _DT**2], [_TORQUE_GAIN * _DT]])
    q = np.diag([1.0, 0.1])  # the environment's cost weights
    r = np.array([[0.001]])
    p = q.copy()
    for _ in range(10_000):
        k = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
        p_next = q + a.T @ p @ (a - b @ k)
        if np.allclose(p_next, p, rtol=1e-12, atol=1e-12):
            p = p_next
            break
        p = p_next
    k = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
    return k[0], p


def expert_action(obs: np.ndarray) -> np.ndarray:
    """Energy swing-up + LQR balance torques for a batch of observations.

    Args:
        obs: ``(N, 3)`` Pendulum observations ``(cos theta, sin theta, theta')``.

    Returns:
        ``(N, 1)`` float32 torques in ``[-2, 2]``.
    """
    obs = np.asarray(obs, dtype=np.float64).reshape(-1, 3)
    cos, sin, velocity = obs[:, 0], obs[:, 1], obs[:, 2]
    angle = np.arctan2(sin, cos)  # 0 upright, in [-pi, pi]
    gain, cost_to_go = _lqr()

    energy = 0.5 * velocity**2 + _GRAVITY_GAIN * cos
    direction = np.where(velocity >= 0, 1.0, -1.0)
    swing = _SWING_GAIN * (_UPRIGHT_ENERGY - energy) * direction

    state = np.stack([angle, velocity], axis=1)
    balance = -(state @ gain)
    near_upright = np.einsum("ni,ij,nj->n", state, cost_to_go, state) < _BALANCE_REGION

    torque = np.where(near_upright, balance, swing)
    return np.clip(torque, -MAX_TORQUE, MAX_TORQUE).astype(np.float32)[:, None]


def random_action(n: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, 1)`` float32 torques drawn uniformly from ``[-2, 2]``."""
    return rng.uniform(-MAX_TORQUE, MAX_TORQUE, size=(n, 1)).astype(np.float32)


Policy = Callable[[np.ndarray, np.random.Generator], np.ndarray]
"""A batched behaviour policy: ``(obs (N, 3), rng) -> torques (N, 1)``."""


@dataclass(frozen=True)
class EpsilonRandomExpert:
    """The expert, replaced by a uniform random torque with probability ``epsilon`` each step.

    ``epsilon`` is a scalar or one value per environment of the batch; 0 is the expert, 1 the
    uniform random policy. The generator is consumed identically for every epsilon.
    """

    epsilon: float | np.ndarray

    def __call__(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = len(obs)
        explore = rng.random(n) < np.broadcast_to(np.asarray(self.epsilon, dtype=np.float64), n)
        noise = random_action(n, rng)
        return np.where(explore[:, None], noise, expert_action(obs))


# ----------------------------------------------------------------------------- rollouts


@dataclass(frozen=True)
class Rollout:
    """``N`` complete episodes of equal length ``T`` (arrays are read-only)."""

    seeds: np.ndarray  # (N,) reset seeds
    observations: np.ndarray  # (N, T + 1, 3) float32
    actions: np.ndarray  # (N, T, 1) float32
    rewards: np.ndarray  # (N, T) float64
    terminations: np.ndarray  # (N, T) bool
    truncations: np.ndarray  # (N, T) bool

    @property
    def returns(self) -> np.ndarray:
        return self.rewards.sum(axis=1)

    def buffers(self, first_id: int = 0) -> list[EpisodeBuffer]:
        return local_datasets.episode_buffers(self, first_id)


def rollout(policy: Policy, seeds: np.ndarray, rng: np.random.Generator) -> Rollout:
    """Run one ``Pendulum-v1`` episode per reset seed, all in lockstep, until truncation.

    The episodes are stepped by gymnasium's own environments (a synchronous vector env, one
    env per seed), so the data is whatever gymnasium computes on this machine: there is no
    second simulator to keep in step with it. The policy sees the batch of observations.
    """
    seeds = np.asarray(seeds, dtype=np.int64)
    n = len(seeds)
    steps = gym.spec(ENV_ID).max_episode_steps
    observations = np.empty((n, steps + 1, 3), dtype=np.float32)
    actions = np.empty((n, steps, 1), dtype=np.float32)
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


def _policy(kind: str, episodes: int) -> Policy:
    if kind == "random":
        return EpsilonRandomExpert(1.0)
    if kind == "medium":
        return EpsilonRandomExpert(MEDIUM_EPSILON)
    if kind == "expert":
        return EpsilonRandomExpert(0.0)
    if kind == "medium-replay":
        return EpsilonRandomExpert(np.linspace(REPLAY_START_EPSILON, MEDIUM_EPSILON, episodes))
    raise ValueError(f"unknown policy kind {kind!r}")


@functools.lru_cache(maxsize=8)
def _kind_rollout(kind: str, episodes: int, seed: int) -> Rollout:
    """The episodes of one policy kind (cached: medium-expert reuses medium and expert)."""
    rng = np.random.default_rng([seed, _KIND_OFFSET[kind]])
    return rollout(_policy(kind, episodes), _seeds(kind, episodes, seed), rng)


# ----------------------------------------------------------------------------- reference scores


@functools.lru_cache(maxsize=16)
def reference_scores(seed: int = 0, episodes: int = REFERENCE_EPISODES) -> tuple[float, float]:
    """``(ref_min_score, ref_max_score)``: mean returns of the uniform random policy and of the
    expert over ``episodes`` seeded evaluation episodes (the same start states for both; seeds
    disjoint from the datasets'). Cached per process."""
    seeds = _seeds("evaluation", episodes, seed)
    rng = np.random.default_rng([seed, _KIND_OFFSET["evaluation"]])
    random_returns = rollout(EpsilonRandomExpert(1.0), seeds, rng).returns
    expert_returns = rollout(EpsilonRandomExpert(0.0), seeds, rng).returns
    return float(random_returns.mean()), float(expert_returns.mean())


# ----------------------------------------------------------------------------- datasets

_ALGORITHM_NAMES = {
    "pendulum/random-v0": "uniform-random",
    "pendulum/medium-v0": f"epsilon-random({MEDIUM_EPSILON}) energy-swing-up+LQR",
    "pendulum/expert-v0": "energy-swing-up+LQR",
    "pendulum/medium-replay-v0": (
        f"epsilon-random({REPLAY_START_EPSILON}->{MEDIUM_EPSILON}) energy-swing-up+LQR"
    ),
    "pendulum/medium-expert-v0": (
        f"epsilon-random({MEDIUM_EPSILON}) energy-swing-up+LQR + energy-swing-up+LQR"
    ),
}

_KINDS = {
    "pendulum/random-v0": ("random",),
    "pendulum/medium-v0": ("medium",),
    "pendulum/expert-v0": ("expert",),
    "pendulum/medium-replay-v0": ("medium-replay",),
    "pendulum/medium-expert-v0": ("medium", "expert"),
}


def is_embedded(dataset_id: str) -> bool:
    """Whether ``dataset_id`` is one of the datasets this module can build."""
    return dataset_id in EMBEDDED_DATASETS


def build_embedded_dataset(
    dataset_id: str, *, overwrite: bool = False, episodes: int = 500, seed: int = 0
) -> minari.MinariDataset:
    """Build (or load) an embedded Pendulum dataset in the local Minari folder.

    Args:
        dataset_id: one of :data:`EMBEDDED_DATASETS`.
        overwrite: delete and rebuild the dataset if it exists locally; otherwise an existing
            dataset is loaded and returned as it is (whatever ``episodes`` and ``seed`` built it).
        episodes: episodes of 200 steps per policy (medium-expert holds twice as many).
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
    rollouts = [_kind_rollout(kind, episodes, seed) for kind in _KINDS[dataset_id]]
    buffers: list[EpisodeBuffer] = []
    for part in rollouts:
        buffers.extend(part.buffers(first_id=len(buffers)))
    returns = np.concatenate([part.returns for part in rollouts])
    score = float(normalized_score(returns.mean(), ref_min, ref_max))
    description = (
        f"{EMBEDDED_DATASETS[dataset_id]} {len(buffers)} episodes of 200 steps, built by "
        f"trajectory_transformer.data.pendulum (seed {seed}). Mean return {returns.mean():.1f}, "
        f"normalised score {score:.1f} (ref_min_score {ref_min:.1f}: uniform random policy; "
        f"ref_max_score {ref_max:.1f}: energy swing-up + LQR expert; "
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
        namespace_description="Pendulum-v1 datasets built by trajectory_transformer.",
    )
