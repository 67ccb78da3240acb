"""The embedded datasets: every id in one place, and a builder that dispatches by suite.

Each suite builds its datasets locally, offline, over the shared machinery of
:mod:`trajectory_transformer.suites.collect`, and stores its reference scores in the Minari
metadata: :mod:`~trajectory_transformer.suites.pendulum` (``pendulum/*``, ``Pendulum-v1``) and
:mod:`~trajectory_transformer.suites.reacher` (``reacher/*``, ``Reacher-v5``) from scripted
controllers, :mod:`~trajectory_transformer.suites.locomotion` (``hopper/*``, ``Hopper-v5``;
``walker2d/*``, ``Walker2d-v5``) from shipped SAC actors,
:mod:`~trajectory_transformer.suites.double_pendulum` (``inverteddoublependulum/*``,
``InvertedDoublePendulum-v5``, terminating) from an LQR controller,
:mod:`~trajectory_transformer.suites.inverted_pendulum` (``invertedpendulum/*``,
``InvertedPendulum-v5``, terminating) from the pole gains of an LQR,
:mod:`~trajectory_transformer.suites.pointmaze` (``pointmaze/*``, gymnasium-robotics'
PointMaze, Dict observations with goals; one suite per maze) from D4RL's maze2d waypoint
controller. Callers (``load_minari``, ``tt-collect``) go through this module only.
"""

from __future__ import annotations

import minari

from trajectory_transformer.suites import (
    double_pendulum,
    inverted_pendulum,
    locomotion,
    pendulum,
    pointmaze,
    reacher,
)
from trajectory_transformer.suites.collect import Suite

__all__ = [
    "EMBEDDED_DATASETS",
    "SUITES",
    "behaviour_agent",
    "build_embedded_dataset",
    "is_embedded",
    "suite_of",
]

SUITES: tuple[Suite, ...] = (
    pendulum.SUITE,
    reacher.SUITE,
    locomotion.HOPPER.suite,
    locomotion.WALKER2D.suite,
    double_pendulum.SUITE,
    inverted_pendulum.SUITE,
    *pointmaze.SUITES,
)

EMBEDDED_DATASETS: dict[str, str] = {
    dataset_id: dataset.summary
    for suite in SUITES
    for dataset_id, dataset in suite.datasets.items()
}
"""Every embedded dataset id and a one-line description of its behaviour policy."""


def is_embedded(dataset_id: str) -> bool:
    """Whether ``dataset_id`` is an embedded dataset of any suite."""
    return dataset_id in EMBEDDED_DATASETS


def suite_of(dataset_id: str) -> Suite:
    """The suite that builds ``dataset_id``; a ValueError listing the known ids otherwise."""
    for suite in SUITES:
        if dataset_id in suite.datasets:
            return suite
    raise ValueError(
        f"unknown embedded dataset {dataset_id!r}; known ids: {', '.join(EMBEDDED_DATASETS)}"
    )


def build_embedded_dataset(
    dataset_id: str, *, overwrite: bool = False, episodes: int | None = None, seed: int = 0
) -> minari.MinariDataset:
    """Build (or load, unless ``overwrite``) an embedded dataset in the local Minari folder.

    ``episodes`` is per behaviour policy (a medium-expert dataset holds twice as many); None
    keeps the suite's default (500 episodes for Pendulum and Reacher, a transition budget for
    Hopper and PointMaze). ``seed`` is the base seed of reset seeds, action noise and the
    reference scores.
    """
    return suite_of(dataset_id).build(dataset_id, overwrite=overwrite, episodes=episodes, seed=seed)


def behaviour_agent(dataset_id: str, seed: int = 0) -> object:
    """The policy that made ``dataset_id``, as an evaluation agent whose noise ``seed`` draws
    (:class:`~trajectory_transformer.suites.pointmaze.BehaviourAgent` for the mazes); a
    ValueError naming the datasets that have one, for the others."""
    suite = suite_of(dataset_id)
    if suite.behaviour_agent is None:
        playable = [i for s in SUITES if s.behaviour_agent is not None for i in s.datasets]
        raise ValueError(
            f"{dataset_id} has no behaviour policy to play (its episodes come from several "
            f"policies, or from none that runs as one agent); these have: {', '.join(playable)}"
        )
    return suite.behaviour_agent(seed)
