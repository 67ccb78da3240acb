"""What every Hydra entry point shares: config location, device choice, friendly errors."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import torch

from trajectory_transformer.checkpoint import CheckpointError
from trajectory_transformer.config import ConfigError, register_configs, reject_unknown_keys
from trajectory_transformer.data.minari_source import DatasetError
from trajectory_transformer.rollout.envs import EnvMismatchError

# The YAML files of configs/ ship inside the package (see pyproject.toml), found by import name
# in a checkout, an editable install and a wheel alike.
CONFIG_DIR = "pkg://trajectory_transformer.configs"

register_configs()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DatasetError(
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
        except (DatasetError, CheckpointError, ConfigError, EnvMismatchError) as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    return wrapper
