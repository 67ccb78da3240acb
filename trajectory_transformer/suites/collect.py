"""What every embedded suite shares: seeded rollouts of a batched policy through gymnasium
vector envs, disjoint blocks of reset seeds, reference scores, the Minari write and the builder.

A suite (``pendulum``, ``reacher``, ``locomotion``, ``pointmaze``) is its controllers or actors, the
episodes of each policy kind, and a :class:`Suite` record of its datasets; :meth:`Suite.build`
does the rest. The data is whatever gymnasium (and MuJoCo) compute on the machine that builds
it: there is no second simulator to keep in step, and returns may differ between CPUs in the
last digits.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
from filelock import FileLock
from gymnasium.envs.registration import EnvSpec
from minari.data_collector import EpisodeBuffer
from minari.namespace import create_namespace, list_local_namespaces
from minari.storage import get_dataset_path

from trajectory_transformer.scores import normalized_score

AUTHOR = "trajectory-transformer"

# Disjoint ranges of reset seeds: one block of 10M per base seed, 1M per policy kind in it.
SEED_BLOCK = 10_000_000
KIND_BLOCK = 1_000_000
EVALUATION = 9
"""The kind offset of the reference-score episodes, in every suite."""

Policy = Callable[[np.ndarray, np.random.Generator], np.ndarray]
"""A batched behaviour policy: ``(observations (N, obs_dim), rng) -> actions (N, act_dim)``.
One that keeps a state per row may have ``forget(row)``: :func:`rollout` calls it whenever row
``row`` starts an episode."""
Env = str | EnvSpec
"""A registered env id, or a spec (an env with other settings than its registered ones)."""


def env_name(env: Env) -> str:
    return env.id if isinstance(env, EnvSpec) else env


# ----------------------------------------------------------------------------- policies


@dataclass(frozen=True)
class UniformRandom:
    """The uniform random policy's actions: ``(n, rng) -> (n, dim)`` float32 in
    ``[-bound, bound]``."""

    dim: int
    bound: float = 1.0

    def __call__(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(-self.bound, self.bound, size=(n, self.dim)).astype(np.float32)


@dataclass(frozen=True)
class EpsilonRandomExpert:
    """``expert``, replaced by ``random`` with probability ``epsilon`` each step.

    ``epsilon`` is a scalar or one value per environment of the batch; 0 is the expert, 1 the
    random policy. The generator is consumed identically for every epsilon.
    """

    expert: Callable[[np.ndarray], np.ndarray]  # observations (N, obs_dim) -> actions
    random: Callable[[int, np.random.Generator], np.ndarray]  # (N, rng) -> actions
    epsilon: float | np.ndarray

    def __call__(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = len(obs)
        explore = rng.random(n) < np.broadcast_to(np.asarray(self.epsilon, dtype=np.float64), n)
        noise = self.random(n, rng)
        return np.where(explore[:, None], noise, self.expert(obs))


# ----------------------------------------------------------------------------- rollouts


@dataclass(frozen=True)
class Rollout:
    """Whole episodes, each with its own length ``T`` (arrays are read-only)."""

    seeds: tuple[int | None, ...]  # the reset seed of each episode; None: it began without one
    observations: tuple[np.ndarray, ...]  # (T + 1, obs_dim), the env's dtype
    actions: tuple[np.ndarray, ...]  # (T, act_dim) float32
    rewards: tuple[np.ndarray, ...]  # (T,) float64
    terminations: tuple[np.ndarray, ...]  # (T,) bool
    truncations: tuple[np.ndarray, ...]  # (T,) bool

    def __post_init__(self) -> None:
        columns = (self.observations, self.actions, self.rewards, self.terminations)
        for array in itertools.chain(*columns, self.truncations):
            array.flags.writeable = False

    @property
    def returns(self) -> np.ndarray:
        return np.array([r.sum() for r in self.rewards])

    @property
    def transitions(self) -> int:
        return sum(len(r) for r in self.rewards)

    def __len__(self) -> int:
        return len(self.seeds)

    @classmethod
    def concatenate(cls, parts: Sequence[Rollout]) -> Rollout:
        columns = ("seeds", "observations", "actions", "rewards", "terminations", "truncations")
        return cls(*(tuple(itertools.chain(*(getattr(p, c) for p in parts))) for c in columns))

    def buffers(self, observation_space: gym.Space | None = None) -> list[EpisodeBuffer]:
        """Minari episode buffers, numbered from 0 in order; flat observations of a Dict
        ``observation_space`` become dicts again (``gymnasium.spaces.unflatten``, batched)."""
        return [
            EpisodeBuffer(
                id=i,
                seed=seed,
                observations=_unflatten(observation_space, self.observations[i]),
                actions=self.actions[i],
                rewards=self.rewards[i],
                terminations=self.terminations[i],
                truncations=self.truncations[i],
                infos={},
            )
            for i, seed in enumerate(self.seeds)
        ]


def _unflatten(space: gym.Space | None, rows: np.ndarray) -> np.ndarray | dict:
    """(n, flatdim) rows of a flattened Dict space as a dict of (n, *shape) arrays."""
    if not isinstance(space, gym.spaces.Dict):
        return rows
    values, start = {}, 0
    for key, subspace in space.spaces.items():
        size = gym.spaces.flatdim(subspace)
        block = rows[:, start : start + size]
        if isinstance(subspace, gym.spaces.Dict):
            values[key] = _unflatten(subspace, block)
        else:
            values[key] = block.reshape(len(rows), *subspace.shape).astype(subspace.dtype)
        start += size
    return values


def rollout(
    env_id: Env,
    policy: Policy,
    seeds: Iterable[int],
    rng: np.random.Generator,
    *,
    num_envs: int | None = None,
    transitions: int | None = None,
    max_episode_steps: int | None = None,
    fixed_length: bool = False,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
) -> Rollout:
    """One episode per reset seed, taken in order, ``num_envs`` stepped together in a
    synchronous vector env: an env whose episode ends starts the next seed at once, so no env
    waits for the longest episode. Terminations and truncations are kept apart, as the env
    returns them.

    The policy sees the whole batch every step, idle envs included (what they do is dropped).
    Without ``num_envs``, every seed gets its own env (row ``i`` of the batch plays seed ``i``
    throughout, so a policy may hold one setting per episode). Without
    ``transitions``, every seed is played. With it (``seeds`` may then be endless), no seed
    starts once that many transitions are stepped, and the result is the shortest prefix of the
    seeds whose episodes hold at least ``transitions`` (by seed order, not by which episodes
    ended first, so short episodes are not favoured). ``max_episode_steps`` replaces the env's
    time limit. ``fixed_length`` asserts that every episode ran to the time limit and ended by
    truncation (environments that never terminate). ``wrappers`` wrap each env (a Dict env in
    ``FlattenObservation``, for a policy of flat observations).
    """
    seeds = iter(seeds)
    first = [int(s) for s in itertools.islice(seeds, num_envs)]
    if not first:
        return Rollout((), (), (), (), (), ())
    n = len(first)
    limits = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = gym.make_vec(
        env_id, num_envs=n, vectorization_mode="sync", wrappers=list(wrappers) or None, **limits
    )
    observation_dtype = env.single_observation_space.dtype
    columns: dict[int, dict[str, list]] = {}  # by reset seed, in the order they started
    playing: list[int | None] = list(first)  # the seed each env plays; None once it is idle
    stepped = 0
    try:
        obs, _ = env.reset(seed=first)
        _forget(policy, range(n))
        for i, seed in enumerate(first):
            columns[seed] = {"o": [obs[i]], "a": [], "r": [], "d": [], "t": []}
        while any(seed is not None for seed in playing):
            actions = np.asarray(policy(obs, rng), dtype=np.float32)
            obs, rewards, terminated, truncated, _ = env.step(actions)
            ended = np.zeros(n, dtype=bool)
            for i, seed in enumerate(playing):
                if seed is None:
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
                    started = np.flatnonzero(mask)
                    _forget(policy, started)
                    for i in started:
                        playing[i] = int(restart[i])
                        columns[playing[i]] = {"o": [obs[i]], "a": [], "r": [], "d": [], "t": []}
    finally:
        env.close()
    kept = list(columns)
    if transitions is not None:
        lengths = np.cumsum([len(columns[seed]["r"]) for seed in kept])
        kept = kept[: int(np.searchsorted(lengths, transitions)) + 1]
    result = Rollout(
        seeds=tuple(kept),
        observations=tuple(np.asarray(columns[s]["o"], dtype=observation_dtype) for s in kept),
        actions=tuple(np.asarray(columns[s]["a"], dtype=np.float32) for s in kept),
        rewards=tuple(np.asarray(columns[s]["r"], dtype=np.float64) for s in kept),
        terminations=tuple(np.asarray(columns[s]["d"], dtype=bool) for s in kept),
        truncations=tuple(np.asarray(columns[s]["t"], dtype=bool) for s in kept),
    )
    if fixed_length:
        spec = env_id if isinstance(env_id, EnvSpec) else gym.spec(env_id)
        _require_time_limit(result, env_name(env_id), max_episode_steps or spec.max_episode_steps)
    return result


def _forget(policy: Policy, rows) -> None:
    """A policy with a state per row starts `rows` afresh: their episodes are new, even where
    a row's new episode looks like its last one (the same goal, say)."""
    forget = getattr(policy, "forget", None)
    if forget is not None:
        for row in rows:
            forget(int(row))


def _require_time_limit(result: Rollout, env_id: str, steps: int) -> None:
    for terminations, truncations in zip(result.terminations, result.truncations, strict=True):
        if len(truncations) != steps or terminations.any() or not truncations[-1]:
            raise RuntimeError(
                f"{env_id} episodes were expected to run {steps} steps and end by truncation; "
                f"one ran {len(truncations)} (terminated: {bool(terminations.any())}). Has the "
                "environment changed?"
            )


def play(
    env_id: Env,
    policy: Policy,
    *,
    seed: int,
    kind: int,
    episodes: int | None = None,
    first: int = 0,
    **options,
) -> Rollout:
    """The episodes of one policy kind: ``episodes`` reset seeds from the kind's own block
    (from ``first`` within it), or, without a count, as many as ``rollout``'s ``transitions``
    take; the policy's noise from a generator seeded by the same numbers."""
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    if episodes is not None and not 0 < episodes <= KIND_BLOCK - first:
        raise ValueError(f"episodes must be in [1, {KIND_BLOCK - first}], got {episodes}")
    if episodes is None and options.get("num_envs") is None:
        raise ValueError("without a count of episodes the seeds are endless: give num_envs")
    start = seed * SEED_BLOCK + kind * KIND_BLOCK + first
    seeds = itertools.count(start) if episodes is None else range(start, start + episodes)
    rng = np.random.default_rng([seed, kind, first])  # first = 0: the stream of [seed, kind]
    return rollout(env_id, policy, seeds, rng, **options)


def evaluation_seeds(seed: int, episodes: int) -> range:
    """The reset seeds of the reference-score episodes of base seed ``seed``."""
    start = seed * SEED_BLOCK + EVALUATION * KIND_BLOCK
    return range(start, start + episodes)


def reference_scores(
    env_id: Env, random: Policy, expert: Policy, seed: int, episodes: int, **options
) -> tuple[float, float]:
    """``(ref_min_score, ref_max_score)``: mean returns of the ``random`` and the ``expert``
    policy over ``episodes`` seeded evaluation episodes (the same start states for both; seeds
    disjoint from every dataset's). ``options`` go to :func:`rollout`."""
    seeds = evaluation_seeds(seed, episodes)
    rng = np.random.default_rng([seed, EVALUATION])
    low = rollout(env_id, random, seeds, rng, **options).returns.mean()
    high = rollout(env_id, expert, seeds, rng, **options).returns.mean()
    return float(low), float(high)


# ----------------------------------------------------------------------------- Minari


@contextlib.contextmanager
def build_lock(dataset_id: str) -> Iterator[None]:
    """Held while a dataset is looked for and, if missing, built: of processes that build the
    same id at once (torchrun ranks, parallel comparison jobs), one builds and the others
    wait, then load what it wrote. A lock file next to the datasets, per id."""
    root = Path(get_dataset_path())
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(root / f".{dataset_id.replace('/', '--')}.build.lock"):
        yield


def existing(dataset_id: str, overwrite: bool) -> minari.MinariDataset | None:
    """The local dataset of that id, unless ``overwrite`` (which deletes it) or there is none."""
    path = get_dataset_path(dataset_id)
    if path.exists():
        if not overwrite:
            return minari.load_dataset(dataset_id)
        shutil.rmtree(path)
    return None


def write(
    dataset_id: str,
    buffers: list[EpisodeBuffer],
    env_id: Env,
    algorithm_name: str,
    ref_scores: tuple[float, float],
    reference_episodes: int,
    description: str,
    namespace_description: str,
    *,
    eval_env: Env | None = None,
    observation_space: gym.Space | None = None,
    requirements: Sequence[str] = (),
    metadata: dict | None = None,
) -> minari.MinariDataset:
    """A Minari dataset of ``buffers`` with reference scores, in the namespace before its first
    '/' (created with ``namespace_description`` if missing); nothing is left behind on failure.
    Called under :func:`build_lock`, where the dataset's folder is this call's own output.
    ``eval_env`` (default: ``env_id``) is the env its scores refer to; ``metadata`` adds keys
    of its own to Minari's (JSON values)."""
    namespace = dataset_id.split("/")[0]
    try:
        with warnings.catch_warnings():
            # No contact address or code permalink exists for these locally built datasets.
            warnings.filterwarnings("ignore", message=r"`(author_email|code_permalink)` is set")
            if namespace not in list_local_namespaces():
                with contextlib.suppress(ValueError):  # created concurrently
                    create_namespace(namespace, description=namespace_description)
            dataset = minari.create_dataset_from_buffers(
                dataset_id=dataset_id,
                buffer=buffers,
                env=env_id,
                eval_env=env_id if eval_env is None else eval_env,
                observation_space=observation_space,
                requirements=list(requirements) or None,
                algorithm_name=algorithm_name,
                author=AUTHOR,
                author_email=None,
                code_permalink=None,
                ref_min_score=ref_scores[0],
                ref_max_score=ref_scores[1],
                num_episodes_average_score=reference_episodes,
                description=description,
            )
            fingerprint = content_fingerprint(dataset.iterate_episodes())
            dataset.storage.update_metadata({**(metadata or {}), FINGERPRINT_KEY: fingerprint})
            return dataset
    except BaseException:
        shutil.rmtree(get_dataset_path(dataset_id), ignore_errors=True)  # no half-written dataset
        raise


FINGERPRINT_KEY = "content_fingerprint"
"""The key of a dataset's content fingerprint in its Minari metadata."""


class ContentFingerprint:
    """A dataset's content fingerprint, fed one Minari episode at a time (`add`), so that a
    pass that reads the episodes for another purpose computes it too. `value()`: `sha256:`
    and 16 hex digits of a digest of every episode's observations (a Dict's values in key
    order), actions, rewards, terminations and truncations, their dtypes and shapes included:
    two builds of a dataset share it only if they hold the same numbers (an embedded dataset
    built on another CPU, or with other library versions, may not)."""

    FIELDS = ("observations", "actions", "rewards", "terminations", "truncations")

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def add(self, episode) -> None:
        for field in self.FIELDS:
            self._add(getattr(episode, field))

    def _add(self, value) -> None:
        if isinstance(value, dict):
            for key in sorted(value):
                self._digest.update(str(key).encode())
                self._add(value[key])
            return
        array = np.ascontiguousarray(value)
        self._digest.update(f"{array.dtype.str}{array.shape}".encode())
        self._digest.update(array.tobytes())

    def value(self) -> str:
        return f"sha256:{self._digest.hexdigest()[:16]}"


def content_fingerprint(episodes: Iterable) -> str:
    """The `ContentFingerprint` of `episodes` (Minari's `EpisodeData`), in one pass."""
    fingerprint = ContentFingerprint()
    for episode in episodes:
        fingerprint.add(episode)
    return fingerprint.value()


# ----------------------------------------------------------------------------- the builder


@dataclass(frozen=True)
class Dataset:
    """One embedded dataset of a suite."""

    summary: str
    """One line on its behaviour policy; the description starts with it."""
    algorithm_name: str
    kinds: tuple[str, ...]
    """The policy kinds whose episodes it holds, in order (medium-expert: medium, expert)."""


@dataclass(frozen=True)
class Collected:
    """A dataset's episodes and reference scores, as its description reports them."""

    dataset_id: str
    dataset: Dataset
    episodes: Rollout
    seed: int
    ref_scores: tuple[float, float]
    reference_episodes: int

    @property
    def mean_return(self) -> float:
        return float(self.episodes.returns.mean())

    @property
    def score(self) -> float:
        return float(normalized_score(self.mean_return, *self.ref_scores))


@dataclass(frozen=True)
class Suite:
    """What the builder needs of a suite: its env, its datasets and how to play each kind."""

    env_id: Env
    datasets: dict[str, Dataset]
    episodes_of: Callable[[str, int | None, int], Rollout]
    """``(kind, episodes per policy or None for the default, seed)`` -> the kind's episodes."""
    reference_scores: Callable[[int, int], tuple[float, float]]
    """``(seed, episodes)`` -> ``(random, expert)`` mean returns."""
    describe: Callable[[Collected], str]
    namespace_description: str
    default_episodes: int | None
    reference_episodes: int = 100
    eval_env: Env | None = None
    """The env that agents are scored in, when it is not ``env_id`` (the collection env)."""
    observation_space: gym.Space | None = None
    """A Dict space whose flattened observations the rollouts hold, stored as dicts."""
    requirements: tuple[str, ...] = ()
    """Packages the env needs beyond gymnasium (pip-style), recorded for Minari."""
    metadata: Callable[[Collected], dict] | None = None
    """Metadata of a dataset's own (its recipe), beside Minari's keys."""
    behaviour_agent: Callable[[int], object] | None = None
    """``(seed)`` -> the policy that made the suite's datasets, as an evaluation agent (the
    ``Agent`` protocol of ``trajectory_transformer.evaluation``), whose noise ``seed`` draws;
    None where a dataset mixes policies or its policy is not one agent."""

    def build(
        self,
        dataset_id: str,
        *,
        overwrite: bool = False,
        episodes: int | None = None,
        seed: int = 0,
        reference_episodes: int | None = None,
    ) -> minari.MinariDataset:
        """Build (or load) one of the suite's datasets in the local Minari folder.

        Args:
            dataset_id: one of :attr:`datasets`.
            overwrite: delete and rebuild the dataset if it exists locally; otherwise an
                existing dataset is loaded and returned as it is (whatever built it).
            episodes: episodes per behaviour policy (a medium-expert dataset holds twice as
                many); None: the suite's default.
            seed: base seed of reset seeds, action noise and the reference scores.
            reference_episodes: episodes of each reference policy; None: the suite's default.
        """
        if dataset_id not in self.datasets:
            raise ValueError(
                f"unknown embedded dataset {dataset_id!r}; known ids: {', '.join(self.datasets)}"
            )
        with build_lock(dataset_id):
            found = existing(dataset_id, overwrite)
            if found is not None:
                return found
            return self._build(dataset_id, episodes, seed, reference_episodes)

    def _build(
        self, dataset_id: str, episodes: int | None, seed: int, reference_episodes: int | None
    ) -> minari.MinariDataset:
        dataset = self.datasets[dataset_id]
        if episodes is None:
            episodes = self.default_episodes
        if reference_episodes is None:
            reference_episodes = self.reference_episodes
        parts = [self.episodes_of(kind, episodes, seed) for kind in dataset.kinds]
        collected = Collected(
            dataset_id,
            dataset,
            Rollout.concatenate(parts),
            seed,
            self.reference_scores(seed, reference_episodes),
            reference_episodes,
        )
        return write(
            dataset_id,
            collected.episodes.buffers(self.observation_space),
            self.env_id,
            dataset.algorithm_name,
            collected.ref_scores,
            reference_episodes,
            self.describe(collected),
            self.namespace_description,
            eval_env=self.eval_env,
            observation_space=self.observation_space,
            requirements=self.requirements,
            metadata=None if self.metadata is None else self.metadata(collected),
        )


def terminating_suite(
    env_id: str,
    datasets: dict[str, Dataset],
    policies: dict[str, Policy],
    random: Policy,
    expert: Policy,
    *,
    expert_name: str,
    builder: str,
    transitions: int,
    num_envs: int,
    reference_episodes: int = 100,
) -> Suite:
    """A suite of scripted policies on a task whose episodes may end by a fall: each kind's
    episodes are the first (by seed) that hold ``transitions`` transitions unless a count is
    given, stepped ``num_envs`` at a time; the reference scores are ``random``'s and
    ``expert``'s (cached per process); the description is :func:`describe_terminating`'s."""
    offsets = {kind: i + 1 for i, kind in enumerate(policies)}  # each kind's block of seeds

    def episodes_of(kind: str, episodes: int | None, seed: int) -> Rollout:
        return play(
            env_id,
            policies[kind],
            seed=seed,
            kind=offsets[kind],
            episodes=episodes,
            transitions=None if episodes is not None else transitions,
            num_envs=num_envs,
        )

    @functools.lru_cache(maxsize=16)
    def scores(seed: int = 0, episodes: int = reference_episodes) -> tuple[float, float]:
        return reference_scores(env_id, random, expert, seed, episodes, num_envs=num_envs)

    def describe(collected: Collected) -> str:
        return (
            f"{describe_terminating(collected, expert=expert_name)}; built by {builder} "
            f"(seed {collected.seed})."
        )

    return Suite(
        env_id=env_id,
        datasets=datasets,
        episodes_of=episodes_of,
        reference_scores=scores,
        describe=describe,
        namespace_description=f"{env_id} datasets built by trajectory_transformer.",
        default_episodes=None,  # transitions
        reference_episodes=reference_episodes,
    )


def describe_fixed_length(collected: Collected, builder: str, expert: str) -> str:
    """The description of a dataset whose episodes all run to the time limit: its policy,
    size, builder and seed, its mean return and normalised score, and the reference policies."""
    low, high = collected.ref_scores
    episodes = collected.episodes
    return (
        f"{collected.dataset.summary} {len(episodes)} episodes of {len(episodes.rewards[0])} "
        f"steps, built by {builder} (seed {collected.seed}). Mean return "
        f"{collected.mean_return:.1f}, normalised score {collected.score:.1f} (ref_min_score "
        f"{low:.1f}: uniform random policy; ref_max_score {high:.1f}: {expert}; "
        f"{collected.reference_episodes} evaluation episodes each)."
    )


def describe_terminating(collected: Collected, expert: str = "expert") -> str:
    """The start of the description of a dataset whose episodes may end by a fall: its policy,
    episodes, transitions and falls, mean return, normalised score and reference policies (the
    suite adds its own details after it)."""
    low, high = collected.ref_scores
    episodes = collected.episodes
    falls = sum(bool(t[-1]) for t in episodes.terminations)
    return (
        f"{collected.dataset.summary} {len(episodes)} episodes, {episodes.transitions} "
        f"transitions ({falls} ending by a fall), mean return {collected.mean_return:.1f}, "
        f"normalised score {collected.score:.1f} (reference scores over "
        f"{collected.reference_episodes} episodes: uniform random {low:.1f}, {expert} "
        f"{high:.1f})"
    )
