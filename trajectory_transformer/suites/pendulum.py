"""Embedded offline datasets for ``Pendulum-v1``, built locally by controllers shipped here.

Nothing is downloaded: every ``pendulum/*`` dataset is generated on demand with the behaviour
policies below, collected and written by the suites' shared machinery
(:mod:`trajectory_transformer.suites.collect`). The episodes are stepped by gymnasium's own
``Pendulum-v1`` (a synchronous vector env, one distinct reset seed per episode), 200 steps each,
ending by truncation under the environment's time limit. Everything is deterministic given a
base seed on a given machine; the data is what gymnasium and numpy compute there, so returns may
differ between CPUs in the last digits.

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
    "random_action",
    "reference_scores",
]

ENV_ID = "Pendulum-v1"
MAX_TORQUE = 2.0
MEDIUM_EPSILON = 0.7
"""Probability of a uniform random torque in the medium policy."""
REPLAY_START_EPSILON = 1.0
"""Epsilon of the first medium-replay episode (falls linearly to ``MEDIUM_EPSILON``)."""
DEFAULT_EPISODES = 500
REFERENCE_EPISODES = 100

_EXPERT = "energy-swing-up+LQR"
_MEDIUM = f"epsilon-random({MEDIUM_EPSILON}) {_EXPERT}"
DATASETS = {
    "pendulum/random-v0": collect.Dataset(
        "Pendulum-v1, uniform random torques.", "uniform-random", ("random",)
    ),
    "pendulum/medium-v0": collect.Dataset(
        f"Pendulum-v1, energy swing-up + LQR expert taking uniform random torques with "
        f"probability {MEDIUM_EPSILON}.",
        _MEDIUM,
        ("medium",),
    ),
    "pendulum/expert-v0": collect.Dataset(
        "Pendulum-v1, energy-based swing-up + LQR balance controller.", _EXPERT, ("expert",)
    ),
    "pendulum/medium-replay-v0": collect.Dataset(
        f"Pendulum-v1, improving epsilon-random experts (epsilon {REPLAY_START_EPSILON} falling "
        f"to {MEDIUM_EPSILON}), like the replay buffer of a learner up to medium quality.",
        f"epsilon-random({REPLAY_START_EPSILON}->{MEDIUM_EPSILON}) {_EXPERT}",
        ("medium-replay",),
    ),
    "pendulum/medium-expert-v0": collect.Dataset(
        "Pendulum-v1, the medium episodes followed by the expert episodes.",
        f"{_MEDIUM} + {_EXPERT}",
        ("medium", "expert"),
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

# Each kind's block of reset seeds (see collect.play).
_KIND_OFFSET = {"random": 0, "medium": 1, "expert": 2, "medium-replay": 3}
_EPSILON = {"random": 1.0, "medium": MEDIUM_EPSILON, "expert": 0.0}  # medium-replay: per episode


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


random_action = collect.UniformRandom(1, MAX_TORQUE)
"""``(n, rng) -> (n, 1)`` float32 torques drawn uniformly from ``[-2, 2]``."""


def epsilon_random_expert(epsilon: float | np.ndarray) -> collect.EpsilonRandomExpert:
    """The expert, replaced by a uniform random torque with probability ``epsilon`` each step
    (a scalar or one value per environment); 0 is the expert, 1 the uniform random policy."""
    return collect.EpsilonRandomExpert(expert_action, random_action, epsilon)


# ----------------------------------------------------------------------------- episodes


@functools.lru_cache(maxsize=8)
def episodes_of(kind: str, episodes: int, seed: int) -> collect.Rollout:
    """The episodes of one policy kind (cached: medium-expert reuses medium and expert)."""
    if kind == "medium-replay":
        epsilon = np.linspace(REPLAY_START_EPSILON, MEDIUM_EPSILON, episodes)  # one per episode
    elif kind in _EPSILON:
        epsilon = _EPSILON[kind]
    else:
        raise ValueError(f"unknown policy kind {kind!r}")
    policy = epsilon_random_expert(epsilon)
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
        collect.describe_fixed_length, builder=__name__, expert="energy swing-up + LQR expert"
    ),
    namespace_description="Pendulum-v1 datasets built by trajectory_transformer.",
    default_episodes=DEFAULT_EPISODES,
    reference_episodes=REFERENCE_EPISODES,
)
