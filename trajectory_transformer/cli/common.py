"""What every Hydra entry point shares: config location, device choice, and settings checked
before any work, a failure being one line on stderr and exit code 2."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from trajectory_transformer import threads
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
    TrainCriticConfig,
)
from trajectory_transformer.comparison.protocol import ComparisonError
from trajectory_transformer.critic.training import CriticConfig
from trajectory_transformer.data.minari_source import DatasetError
from trajectory_transformer.data.reference_scores import ReferenceScoreError
from trajectory_transformer.evaluation.envs import EnvMismatchError
from trajectory_transformer.evaluation.loop import JournalMismatchError
from trajectory_transformer.model.gpt import GPTConfig
from trajectory_transformer.planning.config import PlannerConfig
from trajectory_transformer.suites import pendulum
from trajectory_transformer.training.trainer import NonFiniteLossError, TrainerConfig

# The YAML files of configs/ ship inside the package (see pyproject.toml), found by import name
# in a checkout, an editable install and a wheel alike.
CONFIG_DIR = "pkg://trajectory_transformer.configs"

INTERRUPTED_EXIT_CODE = 130
"""How a command stopped by Ctrl-C exits (128 + SIGINT, as a shell reports it): tt-compare
reads it from its jobs."""


class ConfigError(ValueError):
    """A config key that no schema knows, or settings that do not fit together."""


def register_configs() -> None:
    """Register the schemas so Hydra validates every YAML file and override against them."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="train_critic_schema", node=TrainCriticConfig)
    cs.store(name="collect_schema", node=CollectConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="compare_schema", node=CompareConfig)
    cs.store(group="compare", name="comparison_schema", node=ComparisonConfig)
    cs.store(group="dataset", name="dataset_schema", node=DatasetConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    cs.store(group="planner", name="planner_schema", node=PlannerSchema)
    cs.store(group="critic", name="critic_schema", node=CriticConfig)


def demo_budget(dataset_id: str, steps: int) -> int | None:
    """`${demo_budget:${dataset.id},1500}`: the demo's fixed step budget on the embedded
    Pendulum datasets, None (the stopping rule) on every other dataset."""
    return int(steps) if dataset_id in pendulum.DATASETS else None


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
            siblings = [f"{prefix}{name}" for name in known]
            raise ConfigError(unknown_key_message(f"{prefix}{key}", siblings))
        value = cfg._get_node(key)
        if isinstance(value, DictConfig):
            reject_unknown_keys(value, f"{prefix}{key}.")


def unknown_key_message(key: str, known: Sequence[str]) -> str:
    """One line for a key no schema has: the closest key of its group, else the group's keys;
    where the group itself is unknown, the closest key anywhere."""
    group, _, name = key.rpartition(".")
    siblings = sorted(k for k in known if k.rpartition(".")[0] == group)
    if siblings:
        names = {k.rpartition(".")[2]: k for k in siblings}
        close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
        close = close or [n for n in names if n.startswith(name) or name.startswith(n)][:1]
        if close:
            return f"unknown config key {key}; did you mean {names[close[0]]}?"
        listed = ", ".join(names)
        return f"unknown config key {key}; {group or 'the top level'} takes {listed}"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"unknown config key {key}; did you mean {close[0]}?"
    return f"unknown config key {key}"


def all_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Every key of a config, dotted, groups included."""
    keys = []
    for key in cfg:
        keys.append(f"{prefix}{key}")
        node = cfg._get_node(key)
        if isinstance(node, DictConfig):
            keys += all_keys(node, f"{prefix}{key}.")
    return keys


def check_settings(cfg: DictConfig) -> None:
    """Every setting of a command's config, checked before any work: unknown keys, each field's
    range or choices (checked by the dataclass that owns it), and settings that must fit
    together. A failure is a ConfigError naming the key, its value and what is allowed."""
    reject_unknown_keys(cfg)
    try:
        OmegaConf.to_object(cfg)  # every schema's own checks
        if "planner" in cfg:
            planner = PlannerConfig(**to_container(cfg.planner))
        if "model" in cfg:
            # The data fields come with the dataset; the architecture is checked now.
            data = {"observation_dim": 1, "action_dim": 1, "n_bins": cfg.dataset.n_bins}
            model = GPTConfig(**data, **to_container(cfg.model))
            if cfg.trainer.eval_every is not None:  # the evaluations' planner must fit
                check_planner_fits(planner, model)
    except OmegaConfBaseException as error:
        raise ConfigError(first_line(error)) from None
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_planner_fits(planner: PlannerConfig, model: GPTConfig) -> None:
    """Context and horizon fit the model's window of transitions."""
    needed = planner.context_transitions + planner.horizon
    if needed > model.sequence_transitions:
        raise ValueError(
            f"planner.context_transitions + planner.horizon = {needed} transitions exceed "
            f"model.sequence_transitions = {model.sequence_transitions}, the model's window; "
            "lower the first two or raise the third"
        )


def compose(config_name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """A command's config with `overrides`, composed as Hydra would, inside a Hydra run or
    outside one."""
    if GlobalHydra.instance().is_initialized():
        return hydra.compose(config_name, overrides=list(overrides))
    with hydra.initialize_config_module("trajectory_transformer.configs", version_base="1.3"):
        return hydra.compose(config_name, overrides=list(overrides))


def planner_settings(overrides: Sequence[str]) -> dict:
    """The planner settings tt-eval composes from these overrides (`planner=<preset>`,
    `planner.<key>=<value>`, ...), for `BeamPlanner.from_checkpoint(run, **settings)`."""
    return to_container(compose("eval", overrides).planner)


def planner_preset(name: str) -> dict:
    """The planner settings of `tt-eval planner=<name>` (a configs/planner preset), for
    Python: `BeamPlanner.from_checkpoint(run, **planner_preset("maze"))`."""
    return planner_settings([f"planner={name}"])


def first_line(error: BaseException) -> str:
    """An OmegaConf or Hydra error in one line: its message and the key it is about."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    key = getattr(error, "full_key", None)
    return f"{key}: {text}" if key and key not in text else text


def override_key(override: str) -> str:
    """The key or config group a command-line override sets: `planner.horizon` for
    `+planner.horizon=5`, `planner` for `planner=maze`."""
    return override.split("=", 1)[0].lstrip("+~")


def config_without(config_name: str, overrides: Sequence[str], key: str) -> DictConfig:
    """The config composed with the overrides that do not set `key` (nor a key below it), or
    with none where those fail too."""

    def sets_key(override: str) -> bool:
        name = override_key(override)
        return name == key or name.startswith(f"{key}.")

    try:
        return compose(config_name, [o for o in overrides if not sets_key(o)])
    except (HydraException, OmegaConfBaseException, ValueError):
        return compose(config_name)


def override_error(error: Exception, config_name: str, overrides: Sequence[str] = ()) -> str:
    """One line for a command line that Hydra cannot compose: the key or the group option
    that is wrong, and the closest valid one, among the keys of the config that the command
    line's other overrides select (another `compare=` has other agents)."""
    cause = error.__cause__ or error
    key = getattr(cause, "full_key", None)
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key:
        return unknown_key_message(key, all_keys(config_without(config_name, overrides, key)))
    if isinstance(error, MissingConfigException):
        text = str(error)
        missing = re.search(r"Could not find '([^'/]+)/([^']+)'", text)
        available = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)*)", text)
        if missing and available:
            group, option = missing.groups()
            options = [o.strip() for o in available.group(1).split("\n") if o.strip()]
            options = [o for o in options if not o.endswith("_schema")]
            close = difflib.get_close_matches(option, options, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            return f"no {group} config named {option}{hint} ({group} takes {', '.join(options)})"
    if isinstance(error, OverrideParseException) and (quoted := quoted_list(overrides)):
        return f"{first_line(cause)}: quote each list item that holds '=', as in '{quoted}'"
    return first_line(cause)


def quoted_list(overrides: Sequence[str]) -> str | None:
    """The first override whose list value holds unquoted `key=value` items, with each item
    quoted (Hydra's grammar reads a bare `=` inside a list as an error), or None."""
    for override in overrides:
        key, equals, value = override.partition("=")
        bare = not any(quote in value for quote in "\"'")
        if equals and value.startswith("[") and value.endswith("]") and "=" in value and bare:
            items = ['"' + item.strip() + '"' for item in value[1:-1].split(",") if item.strip()]
            return f"{key}=[{','.join(items)}]"
    return None


def check_command_line(config_name: str, arguments: Sequence[str]) -> None:
    """Compose the command line's overrides once before Hydra runs, so that a typo, a wrong
    type or a bad value is one line and exit 2 instead of Hydra's message or a traceback.
    Hydra's own flags (--help, --cfg, --multirun, ...) and `hydra.*` overrides are left to
    it."""
    if any(argument.startswith("-") for argument in arguments):
        return
    overrides = [a for a in arguments if not a.startswith(("hydra.", "hydra/", "+hydra"))]
    try:
        try:
            cfg = compose(config_name, overrides)
        except (HydraException, OmegaConfBaseException, ValueError) as error:
            raise ConfigError(override_error(error, config_name, overrides)) from None
        check_settings(cfg)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def command(config_name: str) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:
    """A command line entry point over `task(cfg)`: the settings checked first (one line and
    exit 2 when one is wrong), then Hydra's main with the project's errors as one line too."""

    def decorate(task: Callable[[DictConfig], None]) -> Callable[[], None]:
        hydra_main = hydra.main(
            config_path=CONFIG_DIR, config_name=config_name, version_base="1.3"
        )(friendly_errors(task))

        @functools.wraps(task)
        def main() -> None:
            check_command_line(config_name, sys.argv[1:])
            threads.fit_threads_to_cpus()  # a container's CPU quota, unless OMP_NUM_THREADS
            hydra_main()

        return main

    return decorate


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
            check_settings(args[0])
            return task(*args, **kwargs)
        except (
            DatasetError,
            CheckpointError,
            ConfigError,
            EnvMismatchError,
            JournalMismatchError,
            ComparisonError,
            ReferenceScoreError,
            NonFiniteLossError,
        ) as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    return wrapper
