"""Every embedded dataset in one place: the ids, and a builder that dispatches by family.

The families are :mod:`trajectory_transformer.data.pendulum` (``pendulum/*``, ``Pendulum-v1``),
:mod:`trajectory_transformer.data.reacher` (``reacher/*``, ``Reacher-v5``), both from scripted
controllers, and :mod:`trajectory_transformer.data.hopper` (``hopper/*``, ``Hopper-v5``), from
shipped SAC actors. Each builds its datasets locally and stores its reference scores in the
Minari metadata; callers (``load_minari``, ``tt-collect``) go through this module only.
"""

from __future__ import annotations

from types import ModuleType

import minari

from trajectory_transformer.data import hopper, pendulum, reacher

__all__ = ["EMBEDDED_DATASETS", "build_embedded_dataset", "family", "is_embedded"]

_FAMILIES: tuple[ModuleType, ...] = (pendulum, reacher, hopper)

EMBEDDED_DATASETS: dict[str, str] = {
    dataset_id: description
    for module in _FAMILIES
    for dataset_id, description in module.EMBEDDED_DATASETS.items()
}
"""Every embedded dataset id and a one-line description of its behaviour policy."""


def is_embedded(dataset_id: str) -> bool:
    """Whether ``dataset_id`` is an embedded dataset of any family."""
    return dataset_id in EMBEDDED_DATASETS


def family(dataset_id: str) -> ModuleType:
    """The module that builds ``dataset_id``; a ValueError listing the known ids otherwise."""
    for module in _FAMILIES:
        if module.is_embedded(dataset_id):
            return module
    raise ValueError(
        f"unknown embedded dataset {dataset_id!r}; known ids: {', '.join(EMBEDDED_DATASETS)}"
    )


def build_embedded_dataset(
    dataset_id: str, *, overwrite: bool = False, episodes: int | None = None, seed: int = 0
) -> minari.MinariDataset:
    """Build (or load, unless ``overwrite``) an embedded dataset in the local Minari folder.

    ``episodes`` is per behaviour policy (a medium-expert dataset holds twice as many); None
    keeps the family's default (500 episodes for Pendulum and Reacher, a transition budget for
    Hopper). ``seed`` is the base seed of reset seeds, action
    noise and the reference scores.
    """
    module = family(dataset_id)
    kwargs = {} if episodes is None else {"episodes": episodes}
    return module.build_embedded_dataset(dataset_id, overwrite=overwrite, seed=seed, **kwargs)
