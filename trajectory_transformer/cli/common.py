"""What every Hydra entry point shares: config location, device choice, friendly errors."""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from trajectory_transformer.checkpoint import CheckpointError
from trajectory_transformer.cli.schemas import (
    CollectConfig,
    CompareConfig,
    ComparisonConfig,
    DatasetConfig,
    EvaluateConfig,
    ModelConfig,
    PlannerSchema,
    TrainConfig,
)
from trajectory_transformer.comparison.protocol import ComparisonError
from trajectory_transformer.data import pendulum
from trajectory_transformer.data.minari_source import DatasetError
from trajectory_transformer.data.reference_scores import ReferenceScoreError
from trajectory_transformer.evaluation.envs import EnvMismatchError
from trajectory_transformer.training.trainer import TrainerConfig

# The YAML files of configs/ ship inside the package (see pyproject.toml), found by import name
# in a checkout, an editable install and a wheel alike.
CONFIG_DIR = "pkg://trajectory_transformer.configs"


class ConfigError(ValueError):
    """A config key that no schema knows, or settings that do not fit together."""


def register_configs() -> None:
    """Register the schemas so Hydra validates every YAML file and override against them."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="collect_schema", node=CollectConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="compare_schema", node=CompareConfig)
    cs.store(group="compare", name="comparison_schema", node=ComparisonConfig)
    cs.store(group="dataset", name="dataset_schema", node=DatasetConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    cs.store(group="planner", name="planner_schema", node=PlannerSchema)


def demo_budget(dataset_id: str, steps: int) -> int | None:
    """`${demo_budget:${dataset.id},1500}`: the demo's fixed step budget on the embedded
    Pendulum datasets, None (the stopping rule) on every other dataset."""
    return int(steps) if pendulum.is_embedded(dataset_id) else None


register_configs()
OmegaConf.register_new_resolver("demo_budget", demo_budget, replace=True)


def reject_unknown_keys(cfg: Any, prefix: str = "") -> None:
    """Refuse keys that the schema lacks, including those forced in with Hydra's `+key=`."""
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return
    known = {f.name for f in dataclasses.fields(schema)}
    for key in cfg:
        if key not in known:
            raise ConfigError(
                f"unknown config key {prefix}{key}; {prefix.rstrip('.') or 'the top level'} "
                f"takes {', '.join(sorted(known))}."
            )
        value = cfg._get_node(key)
        if isinstance(value, DictConfig):
            reject_unknown_keys(value, f"{prefix}{key}.")


def to_container(cfg: Any) -> dict:
    """A resolved, plain-Python copy of a config (for checkpoints and logs)."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device={name} was asked for, but no CUDA device is visible; use device=cpu."
        )
    return device


def friendly_errors(task: Callable) -> Callable:
    """Print the project's own errors as one plain message (no traceback) and exit 2."""

    @functools.wraps(task)
    def wrapper(*args, **kwargs):
        try:
            reject_unknown_keys(args[0])
            return task(*args, **kwargs)
        except (
            DatasetError,
            CheckpointError,
            ConfigError,
            EnvMismatchError,
            ComparisonError,
            ReferenceScoreError,
        ) as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    return wrapper
