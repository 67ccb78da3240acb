"""Embedded offline datasets for ``Hopper-v5``, collected from shipped SAC policies.

The D4RL recipe on a terminating locomotion task, built on demand and offline like the
Pendulum and Reacher suites. The behaviour policies are small actors trained once with SAC by
``scripts/train_behaviour_policy.py`` and shipped in ``suites/policies/hopper/`` (their README
gives the recipe and the returns). Episodes are stepped by gymnasium's own ``Hopper-v5``
(MuJoCo; a synchronous vector env of ``NUM_ENVS`` envs, each starting the next reset seed as
soon as its episode ends: :func:`~trajectory_transformer.suites.collect.rollout`). An episode
ends by **termination** when the hopper falls (unhealthy height or angle) or by **truncation**
at the 1,000-step time limit; Minari stores the two flags apart, as the environment returned
them.
The data is what gymnasium and MuJoCo compute on the machine that builds it, so returns may
differ between CPUs in the last digits.

Datasets (the actors' tanh-mean actions plus Gaussian noise, clipped to ``[-1, 1]``):

* ``hopper/medium-v0``: the medium actor (about a third of the expert's return), noise
  ``NOISE["medium"]``, until ``TRANSITIONS["medium"]`` transitions.
* ``hopper/medium-replay-v0``: noisy rollouts of the intermediate snapshots of the same SAC run
  (at about a quarter, a half and three quarters of the medium return) and of the medium
  actor, equal shares of ``TRANSITIONS["medium-replay"]``. D4RL's medium-replay is the replay
  buffer of the medium policy's training; that buffer is not shipped, so its stages are
  sampled again from snapshots.
* ``hopper/expert-v0``: the expert actor, noise ``NOISE["expert"]``.
* ``hopper/medium-expert-v0``: the episodes of ``medium-v0`` followed by those of
  ``expert-v0`` (the same seeds, so the same episodes).

Reference scores, stored in every dataset's metadata: ``ref_min_score`` is the mean return of
the uniform random policy and ``ref_max_score`` that of the deterministic expert actor, each
over 100 seeded episodes (:func:`reference_scores`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from trajectory_transformer.suites import collect
from trajectory_transformer.suites.actors import GaussianActor, one_thread

ENV_ID = "Hopper-v5"
POLICY_DIR = Path(__file__).parent / "policies" / "hopper"
REFERENCE_EPISODES = 100
NOISE = {"medium": 0.1, "medium-replay": 0.1, "expert": 0.05}
"""Standard deviation of the Gaussian action noise of each dataset's rollouts."""
TRANSITIONS = {"medium": 100_000, "medium-replay": 60_000, "expert": 100_000}
"""Each dataset is collected until it holds at least this many transitions."""
NUM_ENVS = 25  # episodes stepped together in one vector env
_STAGE_SEEDS = 100_000  # medium-replay: each snapshot's seeds start this far after the last's

DATASETS = {
    "hopper/medium-v0": collect.Dataset(
        "Hopper-v5, the SAC medium actor (a third of the expert) with noise.",
        "SAC actor, medium",
        ("medium",),
    ),
    "hopper/medium-replay-v0": collect.Dataset(
        "Hopper-v5, noisy SAC snapshots from early training to medium.",
        "SAC actor, medium-replay",
        ("medium-replay",),
    ),
    "hopper/expert-v0": collect.Dataset(
        "Hopper-v5, the SAC expert actor with small noise.", "SAC actor, expert", ("expert",)
    ),
    "hopper/medium-expert-v0": collect.Dataset(
        "Hopper-v5, hopper/medium-v0 and hopper/expert-v0 together.",
        "SAC actor, medium-expert",
        ("medium", "expert"),
    ),
}

# Each kind's block of reset seeds (see collect.play).
_KIND_OFFSET = {"medium": 1, "medium-replay": 2, "expert": 3}


@functools.cache
def actor(name: str) -> GaussianActor:
    """A shipped actor: `expert`, `medium` or `replay_<i>`."""
    path = POLICY_DIR / f"{name}.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"the Hopper behaviour policy {path} is missing: train and select the actors with "
            "`python scripts/train_behaviour_policy.py --run-dir outputs/sac-hopper`, then "
            f"`... --run-dir outputs/sac-hopper --select {POLICY_DIR}`"
        )
    return GaussianActor.load(path)


def replay_actors() -> list[str]:
    """The intermediate snapshots, earliest first, then the medium actor."""
    return [p.stem for p in sorted(POLICY_DIR.glob("replay_*.pt"))] + ["medium"]


def noisy(name: str, noise: float) -> collect.Policy:
    policy = actor(name)
    return lambda obs, rng: policy.act(obs, noise, rng)


def uniform_random(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=(len(obs), 3))


def episodes_of(kind: str, episodes: int | None, seed: int) -> collect.Rollout:
    """The episodes of one policy kind (`medium`, `medium-replay`, `expert`): `episodes` of
    them (per snapshot for medium-replay), or by default the first ones (by seed) that hold
    `TRANSITIONS[kind]` transitions (an equal share per snapshot)."""
    names = replay_actors() if kind == "medium-replay" else [kind]
    budget = TRANSITIONS[kind] // len(names)
    parts = []
    with one_thread():
        for stage, name in enumerate(names):
            parts.append(
                collect.play(
                    ENV_ID,
                    noisy(name, NOISE[kind]),
                    seed=seed,
                    kind=_KIND_OFFSET[kind],
                    episodes=episodes,
                    first=stage * _STAGE_SEEDS,
                    transitions=None if episodes is not None else budget,
                    num_envs=NUM_ENVS,
                )
            )
    return collect.Rollout.concatenate(parts)


@functools.cache
def reference_scores(seed: int = 0, episodes: int = REFERENCE_EPISODES) -> tuple[float, float]:
    """(uniform random, deterministic expert) mean returns over `episodes` seeded episodes."""
    with one_thread():
        return collect.reference_scores(
            ENV_ID, uniform_random, noisy("expert", 0.0), seed, episodes, num_envs=NUM_ENVS
        )


def describe(collected: collect.Collected) -> str:
    low, high = collected.ref_scores
    episodes = collected.episodes
    kinds = collected.dataset.kinds
    noise = ", ".join(f"{k} {NOISE[k]}" for k in kinds) if len(kinds) > 1 else str(NOISE[kinds[0]])
    falls = sum(bool(t[-1]) for t in episodes.terminations)
    return (
        f"{collected.dataset.summary} {len(episodes)} episodes, {episodes.transitions} "
        f"transitions ({falls} ending by a fall), mean return {collected.mean_return:.1f}, "
        f"normalised score {collected.score:.1f} (reference scores over "
        f"{collected.reference_episodes} episodes: uniform random {low:.1f}, expert {high:.1f}); "
        f"action noise {noise}, base seed {collected.seed}. Behaviour "
        "policies: trajectory_transformer/suites/policies/hopper (SAC)."
    )


SUITE = collect.Suite(
    env_id=ENV_ID,
    datasets=DATASETS,
    episodes_of=episodes_of,
    reference_scores=reference_scores,
    describe=describe,
    namespace_description="Hopper-v5 datasets built locally from shipped SAC policies.",
    default_episodes=None,  # TRANSITIONS
    reference_episodes=REFERENCE_EPISODES,
)
