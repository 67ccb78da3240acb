"""Writing the datasets that the project builds itself into the local Minari folder."""

from __future__ import annotations

import contextlib
import shutil
import warnings

import minari
from minari.data_collector import EpisodeBuffer
from minari.namespace import create_namespace, list_local_namespaces
from minari.storage import get_dataset_path

AUTHOR = "trajectory-transformer"


def episode_buffers(episodes, first_id: int = 0) -> list[EpisodeBuffer]:
    """Minari episode buffers of a rollout whose `seeds`, `observations`, `actions`,
    `rewards`, `terminations` and `truncations` hold one entry per episode."""
    return [
        EpisodeBuffer(
            id=first_id + i,
            seed=int(episodes.seeds[i]),
            observations=episodes.observations[i],
            actions=episodes.actions[i],
            rewards=episodes.rewards[i],
            terminations=episodes.terminations[i],
            truncations=episodes.truncations[i],
            infos={},
        )
        for i in range(len(episodes.seeds))
    ]


def existing(dataset_id: str, overwrite: bool) -> minari.MinariDataset | None:
    """The local dataset of that id, unless `overwrite` (which deletes it) or there is none."""
    path = get_dataset_path(dataset_id)
    if path.exists():
        if not overwrite:
            return minari.load_dataset(dataset_id)
        shutil.rmtree(path)
    return None


def write(
    dataset_id: str,
    buffers: list[EpisodeBuffer],
    env_id: str,
    algorithm_name: str,
    ref_scores: tuple[float, float],
    reference_episodes: int,
    description: str,
    namespace_description: str,
) -> minari.MinariDataset:
    """A Minari dataset of `buffers` with reference scores, in the namespace before its first
    '/' (created with `namespace_description` if missing); nothing is left behind on failure."""
    namespace = dataset_id.split("/")[0]
    try:
        with warnings.catch_warnings():
            # No contact address or code permalink exists for these locally built datasets.
            warnings.filterwarnings("ignore", message=r"`(author_email|code_permalink)` is set")
            if namespace not in list_local_namespaces():
                with contextlib.suppress(ValueError):  # created concurrently
                    create_namespace(namespace, description=namespace_description)
            return minari.create_dataset_from_buffers(
                dataset_id=dataset_id,
                buffer=buffers,
                env=env_id,
                eval_env=env_id,
                algorithm_name=algorithm_name,
                author=AUTHOR,
                author_email=None,
                code_permalink=None,
                ref_min_score=ref_scores[0],
                ref_max_score=ref_scores[1],
                num_episodes_average_score=reference_episodes,
                description=description,
            )
    except BaseException:
        shutil.rmtree(get_dataset_path(dataset_id), ignore_errors=True)  # no half-written dataset
        raise
