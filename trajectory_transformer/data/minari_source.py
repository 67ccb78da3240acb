"""Minari datasets: find (or build, or download) one by id and turn it into `Episodes`.

Observations are a flat `Box`, or a `Dict` of them (goal-conditioned collections such as
D4RL's pointmaze, antmaze and kitchen: `observation`, `achieved_goal`, `desired_goal`). A
Dict is flattened as gymnasium's `flatten_space` and `flatten` do: its keys in the space's
order (sorted, as `spaces.Dict` sorts a mapping), each value flattened. That order and every
key's shape are the `observation_layout` of `DatasetInfo`, saved in the checkpoint, and the
evaluation env is flattened the same way (`evaluation.envs.make_env`).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import gymnasium as gym
import minari
import numpy as np

from trajectory_transformer import suites
from trajectory_transformer.data.episodes import Episodes
from trajectory_transformer.suites.collect import FINGERPRINT_KEY, ContentFingerprint


class DatasetError(ValueError):
    """A dataset cannot be used; the message says why and what to do next."""


@dataclass(frozen=True)
class DatasetInfo:
    """What a checkpoint needs to know about the data it was trained on."""

    dataset_id: str
    eval_env_spec: str | None  # gymnasium EnvSpec as JSON, or None when the dataset has none
    eval_env_id: str | None
    observation_dim: int
    action_dim: int
    action_low: list[float]
    action_high: list[float]
    ref_min_score: float | None
    ref_max_score: float | None
    num_episodes: int
    num_transitions: int
    observation_layout: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    """A Dict observation space flattened: its keys (nested ones as `outer/inner`) in the
    order their values are concatenated, each with its shape; None for a flat Box (and in
    checkpoints written before Dict spaces were read)."""
    fingerprint: str | None = None
    """A digest of the dataset's numbers (`suites.collect.content_fingerprint`), so that a
    result names the exact data: from the metadata of an embedded dataset, computed at load
    for others; None in checkpoints written before it."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DatasetInfo:
        """The inverse of `to_dict`; a field that an older checkpoint lacks keeps its default."""
        data = dict(data)
        layout = data.get("observation_layout")
        if layout is not None:
            data["observation_layout"] = tuple(
                (str(key), tuple(int(n) for n in shape)) for key, shape in layout
            )
        return cls(**data)

    def make_env(self, **kwargs) -> gym.Env:
        """The evaluation environment of this dataset."""
        if self.eval_env_spec is not None:
            return gym.make(gym.envs.registration.EnvSpec.from_json(self.eval_env_spec), **kwargs)
        if self.eval_env_id is None:
            raise DatasetError(
                f"dataset {self.dataset_id!r} names no environment; pass one with "
                "`dataset.env_id=<gymnasium id>`."
            )
        return gym.make(self.eval_env_id, **kwargs)


def local_dataset_ids() -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(minari.list_local_datasets())


def load_minari(dataset_id: str, download: bool = False) -> minari.MinariDataset:
    """Open a dataset: an embedded one through its builder (which loads it when it is there,
    and never while another process writes it), another local first, then a download if
    allowed."""
    if suites.is_embedded(dataset_id):
        return suites.build_embedded_dataset(dataset_id)
    local = local_dataset_ids()
    if dataset_id in local:
        return minari.load_dataset(dataset_id)
    if download:
        try:
            minari.download_dataset(dataset_id)
        except Exception as error:  # network, auth and "no such remote id" all end up here
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DatasetError(
                f"could not download Minari dataset {dataset_id!r}: {reason}. Downloads need "
                "network access to the Minari remote; offline, copy the dataset into "
                f"{minari.storage.get_dataset_path()} or train on an embedded one "
                f"({', '.join(suites.EMBEDDED_DATASETS)})."
            ) from None
        return minari.load_dataset(dataset_id)
    shown = ", ".join(local) if local else "none"
    raise DatasetError(
        f"Minari dataset {dataset_id!r} is not available locally "
        f"(looked in {minari.storage.get_dataset_path()}). Local datasets: {shown}. "
        f"Embedded datasets, built on demand: {', '.join(suites.EMBEDDED_DATASETS)} "
        "(or ahead of time with `tt-collect`). To fetch a remote one, run with "
        f"`dataset.id={dataset_id} dataset.download=true` (needs network access)."
    )


def check_spaces(dataset_id: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    """Refuse the spaces a flat token model cannot represent, with the reason: every dimension
    becomes one token, so observations are a 1-D Box or a Dict of them, actions a 1-D Box."""
    if isinstance(observation_space, gym.spaces.Dict):
        for key, space in _leaves(observation_space):
            _check_box(dataset_id, "observation", space, key)
    else:
        _check_box(dataset_id, "observation", observation_space)
    _check_box(dataset_id, "action", action_space)


def _check_box(dataset_id: str, role: str, space: gym.Space, key: str | None = None) -> None:
    where = "" if key is None else f" (Dict key {key!r})"
    supported = f"only 1-D Box {role}s{' or Dicts of them' if role == 'observation' else ''}"
    if not isinstance(space, gym.spaces.Box):
        reason = (
            "discrete values have no order for a token's bins"
            if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
            else "every dimension becomes one token"
        )
        raise DatasetError(
            f"dataset {dataset_id!r} has a {type(space).__name__} {role} space{where}; "
            f"{supported} are supported, since {reason}."
        )
    if len(space.shape) > 1 or (len(space.shape) == 0 and key is None):
        raise DatasetError(
            f"dataset {dataset_id!r} has {role}s of shape {space.shape}{where}; {supported} "
            "are supported (images would need thousands of tokens per step)."
        )


def _leaves(space: gym.spaces.Dict, prefix: str = "") -> list[tuple[str, gym.Space]]:
    """(key path, subspace) of every non-Dict subspace, in the order `flatten` visits them."""
    leaves = []
    for key, subspace in space.spaces.items():
        path = f"{prefix}{key}"
        if isinstance(subspace, gym.spaces.Dict):
            leaves += _leaves(subspace, f"{path}/")
        else:
            leaves.append((path, subspace))
    return leaves


def observation_layout(space: gym.Space) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """The keys and shapes of a Dict observation space in flattening order; None for a Box."""
    if not isinstance(space, gym.spaces.Dict):
        return None
    return tuple((key, tuple(int(n) for n in subspace.shape)) for key, subspace in _leaves(space))


def observation_columns(layout: tuple[tuple[str, tuple[int, ...]], ...]) -> dict[str, slice]:
    """The columns of each key of an `observation_layout` in the flattened observation."""
    columns, start = {}, 0
    for key, shape in layout:
        size = int(np.prod(shape))
        columns[key] = slice(start, start + size)
        start += size
    return columns


def flatten_observations(space: gym.spaces.Dict, observations: dict, rows: int) -> np.ndarray:
    """A batch of Dict observations (each key's array has `rows` rows) as (rows, dim) float32,
    row by row what `gymnasium.spaces.flatten(space, observation)` returns."""
    columns = []
    for key, _ in _leaves(space):
        value = observations
        for part in key.split("/"):
            value = value[part]
        columns.append(np.asarray(value, dtype=np.float32).reshape(rows, -1))
    return np.concatenate(columns, axis=1)


def episodes_from_minari(
    dataset: minari.MinariDataset, fingerprint: ContentFingerprint | None = None
) -> Episodes:
    """Concatenate every episode of a Minari dataset; terminations and truncations kept apart.
    `fingerprint`, if given, is fed every episode on the way."""
    dataset_id = dataset.spec.dataset_id
    space = dataset.observation_space
    check_spaces(dataset_id, space, dataset.action_space)
    is_dict = isinstance(space, gym.spaces.Dict)
    observations, finals, actions, rewards, terminated, truncated = [], [], [], [], [], []
    lengths, ids = [], []
    for episode in dataset.iterate_episodes():
        if fingerprint is not None:
            fingerprint.add(episode)
        n = len(episode.rewards)
        if n == 0:
            continue
        if is_dict:
            episode_observations = flatten_observations(space, episode.observations, n + 1)
        else:
            episode_observations = np.asarray(episode.observations, dtype=np.float32)
        observations.append(episode_observations[:n])
        finals.append(episode_observations[n])
        actions.append(np.asarray(episode.actions, dtype=np.float32).reshape(n, -1))
        rewards.append(np.asarray(episode.rewards, dtype=np.float32))
        term = np.zeros(n, dtype=bool)
        term[-1] = bool(episode.terminations[-1])
        trunc = np.zeros(n, dtype=bool)
        trunc[-1] = bool(episode.truncations[-1]) and not term[-1]
        terminated.append(term)
        truncated.append(trunc)
        lengths.append(n)
        ids.append(episode.id)
    if not lengths:
        raise DatasetError(f"dataset {dataset_id!r} holds no transitions.")
    episodes = Episodes(
        observations=np.concatenate(observations),
        actions=np.concatenate(actions),
        rewards=np.concatenate(rewards),
        terminated=np.concatenate(terminated),
        truncated=np.concatenate(truncated),
        lengths=np.asarray(lengths, dtype=np.int64),
        episode_ids=np.asarray(ids, dtype=np.int64),
        final_observations=np.stack(finals),
    )
    try:
        episodes.check_finite()
    except ValueError as error:
        raise DatasetError(f"dataset {dataset_id!r}: {error}") from None
    return episodes


def dataset_info(
    dataset: minari.MinariDataset, episodes: Episodes, fingerprint: str, env_id: str | None = None
) -> DatasetInfo:
    """Metadata of an opened dataset and its content `fingerprint`; `env_id` overrides its
    evaluation environment."""
    metadata = dataset.storage.metadata
    spec_json = None
    eval_env_id = env_id
    if env_id is None:
        spec = _eval_env_spec(dataset)
        if spec is not None:
            spec_json = spec.to_json()
            eval_env_id = spec.id
    action_space = dataset.action_space
    return DatasetInfo(
        dataset_id=dataset.spec.dataset_id,
        eval_env_spec=spec_json,
        eval_env_id=eval_env_id,
        observation_dim=episodes.observation_dim,
        action_dim=episodes.action_dim,
        action_low=[float(x) for x in np.asarray(action_space.low).ravel()],
        action_high=[float(x) for x in np.asarray(action_space.high).ravel()],
        ref_min_score=_optional_float(metadata.get("ref_min_score")),
        ref_max_score=_optional_float(metadata.get("ref_max_score")),
        num_episodes=episodes.num_episodes,
        num_transitions=episodes.num_transitions,
        observation_layout=observation_layout(dataset.observation_space),
        fingerprint=fingerprint,
    )


def _eval_env_spec(dataset: minari.MinariDataset) -> gym.envs.registration.EnvSpec | None:
    # Minari parses the eval env spec from its metadata but keeps it private.
    return getattr(dataset, "_eval_env_spec", None) or dataset.spec.env_spec


def local_eval_env_id(dataset_id: str) -> str | None:
    """The evaluation env id of a dataset that is already local, without reading its
    episodes; None when it is not local (or names no env)."""
    if dataset_id not in local_dataset_ids():
        return None
    spec = _eval_env_spec(minari.load_dataset(dataset_id))
    return None if spec is None else spec.id


def _optional_float(value: object) -> float | None:
    return None if value is None else float(np.asarray(value).item())


def load_episodes(
    dataset_id: str, download: bool = False, env_id: str | None = None
) -> tuple[Episodes, DatasetInfo]:
    """Open `dataset_id` and return its episodes and metadata."""
    dataset = load_minari(dataset_id, download)
    stored = dataset.storage.metadata.get(FINGERPRINT_KEY)  # an embedded build's
    computed = None if stored else ContentFingerprint()  # others': in the pass that loads
    episodes = episodes_from_minari(dataset, computed)
    return episodes, dataset_info(dataset, episodes, stored or computed.value(), env_id)
