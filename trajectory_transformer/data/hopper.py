"""Embedded offline datasets for ``Hopper-v5``, collected from shipped SAC policies.

The D4RL recipe on a terminating locomotion task, built on demand and offline like the
Pendulum and Reacher suites. The behaviour policies are small actors trained once with SAC by
``scripts/train_behaviour_policy.py`` and shipped in ``data/policies/hopper/`` (their README
gives the recipe and the returns). Episodes are stepped by gymnasium's own ``Hopper-v5``
(MuJoCo; a synchronous vector env, one distinct reset seed per episode). An episode ends by
**termination** when the hopper falls (unhealthy height or angle) or by **truncation** at the
1,000-step time limit; Minari stores the two flags apart, as the environment returned them.
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
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import torch
from minari.data_collector import EpisodeBuffer

from trajectory_transformer.data import local_datasets
from trajectory_transformer.data.behaviour import GaussianActor
from trajectory_transformer.data.scores import normalized_score

ENV_ID = "Hopper-v5"
POLICY_DIR = Path(__file__).parent / "policies" / "hopper"
REFERENCE_EPISODES = 100
NOISE = {"medium": 0.1, "medium-replay": 0.1, "expert": 0.05}
"""Standard deviation of the Gaussian action noise of each dataset's rollouts."""
TRANSITIONS = {"medium": 100_000, "medium-replay": 60_000, "expert": 100_000}
"""Each dataset is collected until it holds at least this many transitions."""
NUM_ENVS = 25  # episodes stepped together in one vector env

EMBEDDED_DATASETS: dict[str, str] = {
    "hopper/medium-v0": "Hopper-v5, the SAC medium actor (a third of the expert) with noise.",
    "hopper/medium-replay-v0": "Hopper-v5, noisy SAC snapshots from early training to medium.",
    "hopper/expert-v0": "Hopper-v5, the SAC expert actor with small noise.",
    "hopper/medium-expert-v0": "Hopper-v5, hopper/medium-v0 and hopper/expert-v0 together.",
}

# Disjoint ranges of reset seeds: one block of 10M per base seed, 1M per dataset kind.
_SEED_BLOCK = 10_000_000
_KIND_BLOCK = 1_000_000
_KIND_OFFSET = {"medium": 1, "medium-replay": 2, "expert": 3, "evaluation": 9}


def is_embedded(dataset_id: str) -> bool:
    return dataset_id in EMBEDDED_DATASETS


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


@dataclass
class Episodes:
    """Whole episodes, each with its own length (observations have one more row)."""

    seeds: list[int]
    observations: list[np.ndarray]  # (T + 1, 11) float64
    actions: list[np.ndarray]  # (T, 3) float32
    rewards: list[np.ndarray]  # (T,) float64
    terminations: list[np.ndarray]  # (T,) bool
    truncations: list[np.ndarray]  # (T,) bool

    @property
    def returns(self) -> np.ndarray:
        return np.array([r.sum() for r in self.rewards])

    @property
    def transitions(self) -> int:
        return sum(len(r) for r in self.rewards)

    def extend(self, other: Episodes) -> None:
        for name in ("seeds", "observations", "actions", "rewards", "terminations", "truncations"):
            getattr(self, name).extend(getattr(other, name))

    def buffers(self) -> list[EpisodeBuffer]:
        return local_datasets.episode_buffers(self)


def rollout(
    policy,
    seeds: Iterable[int],
    rng: np.random.Generator,
    max_episode_steps: int | None = None,
    transitions: int | None = None,
    num_envs: int = NUM_ENVS,
) -> Episodes:
    """One episode per reset seed, taken in order, `num_envs` stepped together: an env whose
    episode ends starts the next seed at once, so no env waits for the longest episode.

    `policy(obs (N, 11), rng) -> actions (N, 3)`. Without `transitions`, every seed of
    `seeds` is played. With it (`seeds` may then be endless), no seed starts once that many
    transitions are stepped, and the result is the shortest prefix of the seeds whose episodes
    hold at least `transitions` (chosen by seed order, not by which episodes ended first, so
    short episodes are not favoured). `max_episode_steps` replaces the time limit of 1,000.
    """
    seeds = iter(seeds)
    first = [int(s) for s in itertools.islice(seeds, num_envs)]
    if not first:
        return Episodes([], [], [], [], [], [])
    n = len(first)
    limits = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = gym.make_vec(ENV_ID, num_envs=n, vectorization_mode="sync", **limits)
    columns: dict[int, dict[str, list]] = {}  # by reset seed, in the order they started
    playing: list[int | None] = list(first)  # the seed each env plays; None once it is idle
    stepped = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actor's batches are tiny: threads only add waiting
    try:
        obs, _ = env.reset(seed=first)
        for i, seed in enumerate(first):
            columns[seed] = {"o": [obs[i]], "a": [], "r": [], "d": [], "t": []}
        while any(seed is not None for seed in playing):
            actions = np.asarray(policy(obs, rng), dtype=np.float32)
            obs, rewards, terminated, truncated, _ = env.step(actions)
            ended = np.zeros(n, dtype=bool)
            for i, seed in enumerate(playing):
                if seed is None:  # idle: what the env does is dropped
                    continue
                episode = columns[seed]
                episode["a"].append(actions[i])
                episode["r"].append(rewards[i])
                episode["d"].append(terminated[i])
                episode["t"].append(truncated[i])
                episode["o"].append(obs[i])
                stepped += 1
                if terminated[i] or truncated[i]:
                    ended[i], playing[i] = True, None
            if ended.any() and (transitions is None or stepped < transitions):
                restart = [next(seeds, None) if end else None for end in ended]
                mask = np.array([seed is not None for seed in restart])
                if mask.any():
                    new_obs, _ = env.reset(
                        seed=[None if s is None else int(s) for s in restart],
                        options={"reset_mask": mask},
                    )
                    obs = np.where(mask[:, None], new_obs, obs)  # a new array: stored rows stay
                    for i in np.flatnonzero(mask):
                        playing[i] = int(restart[i])
                        columns[playing[i]] = {"o": [obs[i]], "a": [], "r": [], "d": [], "t": []}
    finally:
        torch.set_num_threads(threads)
        env.close()
    kept = list(columns)
    if transitions is not None:
        lengths = np.cumsum([len(columns[seed]["r"]) for seed in kept])
        kept = kept[: int(np.searchsorted(lengths, transitions)) + 1]
    return Episodes(
        seeds=kept,
        observations=[np.asarray(columns[s]["o"], dtype=np.float64) for s in kept],
        actions=[np.asarray(columns[s]["a"], dtype=np.float32) for s in kept],
        rewards=[np.asarray(columns[s]["r"], dtype=np.float64) for s in kept],
        terminations=[np.asarray(columns[s]["d"], dtype=bool) for s in kept],
        truncations=[np.asarray(columns[s]["t"], dtype=bool) for s in kept],
    )


def noisy(name: str, noise: float):
    policy = actor(name)
    return lambda obs, rng: policy.act(obs, noise, rng)


def uniform_random(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=(len(obs), 3))


def collect(
    policy, kind: str, seed: int, transitions: int, episodes: int | None = None, first: int = 0
) -> Episodes:
    """`episodes` seeded episodes of `policy`, or, without a count, the first ones (by seed)
    that hold at least `transitions` transitions."""
    base = seed * _SEED_BLOCK + _KIND_OFFSET[kind] * _KIND_BLOCK + first
    rng = np.random.default_rng([seed, _KIND_OFFSET[kind], first])
    if episodes is None:
        return rollout(policy, itertools.count(base), rng, transitions=transitions)
    return rollout(policy, range(base, base + episodes), rng)


@functools.cache
def reference_scores(seed: int = 0, episodes: int = REFERENCE_EPISODES) -> tuple[float, float]:
    """(uniform random, deterministic expert) mean returns over `episodes` seeded episodes."""
    first = seed * _SEED_BLOCK + _KIND_OFFSET["evaluation"] * _KIND_BLOCK
    seeds = list(range(first, first + episodes))
    rng = np.random.default_rng([seed, _KIND_OFFSET["evaluation"]])
    random_returns = rollout(uniform_random, seeds, rng).returns
    expert_returns = rollout(noisy("expert", 0.0), seeds, rng).returns
    return float(random_returns.mean()), float(expert_returns.mean())


def episodes_of(kind: str, seed: int, episodes: int | None = None) -> Episodes:
    """The episodes of one dataset kind (`medium`, `medium-replay`, `expert`): `episodes` of
    them (per snapshot for medium-replay), or by default `TRANSITIONS[kind]` transitions."""
    if kind != "medium-replay":
        return collect(noisy(kind, NOISE[kind]), kind, seed, TRANSITIONS[kind], episodes)
    collected = Episodes([], [], [], [], [], [])
    names = replay_actors()
    for stage, name in enumerate(names):
        share = TRANSITIONS[kind] // len(names)
        policy = noisy(name, NOISE[kind])
        collected.extend(collect(policy, kind, seed, share, episodes, first=stage * 100_000))
    return collected


def build_embedded_dataset(
    dataset_id: str,
    *,
    overwrite: bool = False,
    seed: int = 0,
    episodes: int | None = None,
    reference_episodes: int = REFERENCE_EPISODES,
) -> minari.MinariDataset:
    """Build (or load, unless `overwrite`) one Hopper dataset in the local Minari folder.

    `episodes` per behaviour policy replaces the default transition budget (`TRANSITIONS`);
    `seed` is the base of reset seeds and action noise.
    """
    if not is_embedded(dataset_id):
        raise ValueError(f"unknown Hopper dataset {dataset_id!r}: {', '.join(EMBEDDED_DATASETS)}")
    found = local_datasets.existing(dataset_id, overwrite)
    if found is not None:
        return found
    kind = dataset_id.split("/")[1].removesuffix("-v0")
    if kind == "medium-expert":
        collected = episodes_of("medium", seed, episodes)
        collected.extend(episodes_of("expert", seed, episodes))
        noise = f"medium {NOISE['medium']}, expert {NOISE['expert']}"
    else:
        collected = episodes_of(kind, seed, episodes)
        noise = str(NOISE[kind])
    low, high = reference_scores(seed, reference_episodes)
    returns = collected.returns
    terminated = sum(bool(t[-1]) for t in collected.terminations)
    description = (
        f"{EMBEDDED_DATASETS[dataset_id]} {len(returns)} episodes, {collected.transitions} "
        f"transitions ({terminated} ending by a fall), mean return {returns.mean():.1f}, "
        f"normalised score {normalized_score(returns.mean(), low, high):.1f} (reference scores "
        f"over {reference_episodes} episodes: uniform random {low:.1f}, expert {high:.1f}); "
        f"action noise {noise}, base seed {seed}. Behaviour "
        "policies: trajectory_transformer/data/policies/hopper (SAC)."
    )
    return local_datasets.write(
        dataset_id,
        collected.buffers(),
        ENV_ID,
        algorithm_name=f"SAC actor, {kind}",
        ref_scores=(low, high),
        reference_episodes=reference_episodes,
        description=description,
        namespace_description="Hopper-v5 datasets built locally from shipped SAC policies.",
    )
