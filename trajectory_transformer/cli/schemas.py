"""The command line's configuration: one dataclass per Hydra config group.

The library's own configs live with their code and are documented there once: `GPTConfig`
(model/gpt.py), `TrainerConfig` (training/trainer.py), `PlannerConfig` (planning/config.py).
Here they are composed with the fields that only the command line has (datasets, evaluation,
collection, logging), each documented here once; the YAML files under `configs/` only set
values. The CLI registers these schemas with Hydra (`cli/common.py`), so an unknown key in a
YAML file or on the command line is rejected instead of silently ignored. No Hydra here: the
library imports none.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field

from omegaconf import MISSING

from trajectory_transformer.comparison.protocol import AgentSpec, ComparisonSpec
from trajectory_transformer.critic.training import CriticConfig
from trajectory_transformer.data.discretizer import BIN_VALUES, MAX_BINS, STRATEGIES
from trajectory_transformer.data.episodes import DISCOUNT, TERMINAL_PENALTY
from trajectory_transformer.data.goals import CONTINUING_REWARDS
from trajectory_transformer.model.gpt import GPTConfig
from trajectory_transformer.planning.config import PlannerConfig
from trajectory_transformer.training.trainer import TrainerConfig


def require(
    group: str, config: object, name: str, ok: Callable[[typing.Any], bool], allowed: str
) -> None:
    """Raise a ValueError naming the key (`group.name`, or `name` at the top level), its value
    and what is allowed, unless ok."""
    value = getattr(config, name)
    if not ok(value):
        key = f"{group}.{name}" if group else name
        raise ValueError(f"{key} must be {allowed}, got {value!r}")


MAX_ENVS = 4096
"""Environments stepped together at most: each is a process's worth of simulator state."""


def finite(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


@dataclass
class DatasetConfig:
    id: str = "pendulum/medium-expert-v0"
    """Minari dataset id. Local under MINARI_DATASETS_PATH (else ~/.minari/datasets); the
    embedded ids (`pendulum/*`, `reacher/*`, `hopper/*`, `walker2d/*`, `pointmaze/*`:
    trajectory_transformer.suites) are built on demand when missing."""
    download: bool = False
    """Download a remote Minari dataset that is not local (needs network access)."""
    env_id: str | None = None
    """Evaluation environment id; by default the dataset's own eval env (or its env)."""
    discount: float = DISCOUNT
    """Discount of the reward-to-go that becomes the value token."""
    terminal_penalty: float = TERMINAL_PENALTY
    """Added to the reward of a true termination (never to a time-limit truncation)."""
    discretizer: str = "quantile"
    """Binning per dimension: `quantile` (equal mass) or `uniform` (equal width)."""
    n_bins: int = 100
    """Bins (vocabulary size) per dimension."""
    bin_values: str = "mean"
    """What a token decodes to: `mean`, the mean of the training values in its bin (a point
    mass such as a saturated action or a zero reward gets a bin of its own), or `midpoint` of
    the bin's edges, as the original code did."""
    validation_fraction: float | None = None
    """Episodes held out, whole, for the validation loss. None: 0.1 when training runs to the
    stopping rule (no `trainer.max_steps` or `trainer.epochs`), else none."""
    validation_seed: int = 0
    """Seed of the held-out episodes' choice, the same whatever the training seed; recorded in
    the checkpoint."""
    relabel_goals: float = 0.0
    """Probability that a training window is conditioned on a goal its own episode reaches later
    instead of the dataset's (hindsight relabelling, `data.goals`), with the rewards and values
    recomputed for it; goal-conditioned datasets only (Dict observations with `achieved_goal`
    and `desired_goal`, an env with `compute_reward`). 0: the dataset's own goals."""
    relabel_end_at_goal: bool = True
    """Whether a relabelled episode ends at the first step that reaches its goal, as the
    maze datasets' own episodes end at theirs; false: it goes on to the episode's end, every
    step rewarded for where it ends (a continuing task, shown leaving the goal)."""
    relabel_reached: float = 0.0
    """Probability that a training window is conditioned on a goal it reaches itself (the
    achieved goal after one of its own steps), the relabelled episode going on past it, every
    step rewarded for where it ends: what follows arrival, which a goal-reaching dataset's
    episodes never show (they end there), so that the model learns what stays at a goal. With
    `relabel_goals`, at most 1 in all."""
    relabel_continuing_rewards: str = "scaled"
    """The rewards of a relabelled episode that goes on past its goal (`relabel_reached`, or
    `relabel_end_at_goal=false`): `scaled`, multiplied by 1 - discount, so that staying at the
    goal for good is worth 1, what the dataset's episodes give arriving, and the values fit the
    value bins; `raw`, the environment's own, whose sums lie above the bins and are clipped to
    the top one."""

    def __post_init__(self) -> None:
        check = functools.partial(require, "dataset", self)
        check("discount", lambda x: finite(x) and 0 <= x <= 1, "in [0, 1]")
        check("terminal_penalty", finite, "a finite number")
        check("discretizer", lambda x: x in STRATEGIES, f"one of {', '.join(STRATEGIES)}")
        check("n_bins", lambda x: 2 <= x <= MAX_BINS, f"in [2, {MAX_BINS}]")
        check("bin_values", lambda x: x in BIN_VALUES, f"one of {', '.join(BIN_VALUES)}")
        check(
            "validation_fraction",
            lambda x: x is None or (finite(x) and 0 < x < 1),
            "in (0, 1), or null for the default",
        )
        check("validation_seed", lambda x: x >= 0, "at least 0")
        check("relabel_goals", lambda x: finite(x) and 0 <= x <= 1, "in [0, 1]")
        check(
            "relabel_continuing_rewards",
            lambda x: x in CONTINUING_REWARDS,
            f"one of {', '.join(CONTINUING_REWARDS)}",
        )
        check(
            "relabel_reached",
            lambda x: finite(x) and 0 <= x <= 1 - self.relabel_goals,
            "in [0, 1 - dataset.relabel_goals]",
        )


# Hydra needs mutable schemas; derived from the library's frozen configs, each field is
# documented once, where the config is used.
def _schema(name: str, spec: type, types: dict[str, type], skip: tuple[str, ...] = ()) -> type:
    """A mutable Hydra schema with `spec`'s fields (documented there): `types` replaces a
    field's type with a container (a list for a tuple, a dict for the agents), holding
    `spec`'s default, else empty; any other field without a default is MISSING."""
    hints = typing.get_type_hints(spec)
    fields = []
    for f in dataclasses.fields(spec):
        if f.name in skip:
            continue
        if f.name in types:  # a container: a copy of the default, else an empty one
            kind = types[f.name]
            initial = () if f.default is dataclasses.MISSING else f.default
            make = functools.partial(typing.get_origin(kind), initial)
            fields.append((f.name, kind, field(default_factory=make)))
        else:
            default = MISSING if f.default is dataclasses.MISSING else f.default
            fields.append((f.name, hints[f.name], field(default=default)))
    schema = dataclasses.make_dataclass(name, fields)
    schema.__module__ = __name__  # found by pickle: the joblib launcher pickles the schemas
    return schema


ModelConfig = _schema("ModelConfig", GPTConfig, {}, skip=GPTConfig.DATA_FIELDS)
"""The `model` group: GPTConfig's architecture, whose dimensions tt-train takes from the data."""
PlannerSchema = _schema("PlannerSchema", PlannerConfig, {})
"""The `planner` group of tt-eval: PlannerConfig's fields."""


@dataclass
class WandbConfig:
    mode: str = "disabled"
    """`disabled`, `offline` or `online`."""
    project: str = "trajectory-transformer"
    """wandb project name."""
    entity: str | None = None
    """wandb team or user; None uses the default."""
    name: str | None = None
    """Run name; None lets wandb choose."""

    MODES: typing.ClassVar[tuple[str, ...]] = ("disabled", "offline", "online")

    def __post_init__(self) -> None:
        require("wandb", self, "mode", lambda x: x in self.MODES, "disabled, offline or online")


@dataclass
class TrainConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """The data and its tokens: a preset of configs/dataset/ (which may also pick the model
    and trainer presets), or any Minari id with `dataset.id=...`."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The architecture (GPTConfig); its dimensions come from the data."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Optimiser, schedule, length, validation, checkpoints and precision (TrainerConfig)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Logging to Weights & Biases (off by default)."""
    planner: PlannerSchema = field(default_factory=PlannerSchema)  # type: ignore[valid-type]
    """The planner of the evaluations during training (`trainer.eval_every`)."""
    seed: int = 0
    """Seed of parameters, batch order and dropout."""
    distributed_timeout_s: float = 900.0
    """Under torchrun: how long a rank waits for the others in a collective before it fails
    with an error (a rank that died); waiting for rank 0's planner evaluation is exempt."""
    device: str = "auto"
    """`auto` (cuda when available), `cpu`, `cuda`, `cuda:1`, ..."""
    resume: str | None = None
    """Checkpoint to continue from: optimiser, schedule, RNG and position are restored."""

    def __post_init__(self) -> None:
        require("", self, "seed", lambda x: x >= 0, "at least 0")
        timeout = "distributed_timeout_s"
        require("", self, timeout, lambda x: finite(x) and x > 0, "a finite number > 0")


@dataclass
class CriticDatasetConfig:
    id: str = MISSING
    """Minari dataset id, as tt-train's `dataset.id` (embedded ids are built on demand)."""
    download: bool = False
    """Download a remote Minari dataset that is not local (needs network access)."""
    env_id: str | None = None
    """Evaluation environment id recorded with the critic (its policy is evaluated there);
    by default the dataset's own."""


@dataclass
class TrainCriticConfig:
    dataset: CriticDatasetConfig = field(default_factory=CriticDatasetConfig)
    """The Minari dataset the critic learns from (`dataset.id` is required)."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """IQL's hyperparameters and the run's length (CriticConfig)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Logging to Weights & Biases (off by default)."""
    seed: int = 0
    """Seed of the networks' initialisation and of the batches."""
    device: str = "auto"
    """`auto` (cuda when available), `cpu`, `cuda`, ..."""
    resume: str | None = None
    """A critic.pt to continue from: networks, optimisers, batch generator and step."""

    def __post_init__(self) -> None:
        require("", self, "seed", lambda x: x >= 0, "at least 0")


@dataclass
class EvalConfig:
    episodes: int = 10
    """Episodes to play; episode i is seeded with `seed + i`."""
    num_envs: int = 10
    """Environments stepped (and planned) together in one vector env."""
    seed: int = 0
    """Seed of the first episode."""
    env_id: str | None = None
    """Evaluation env id; by default the one stored in the checkpoint's dataset metadata."""
    max_episode_steps: int | None = None
    """Cut episodes at this many steps (a time-limit truncation); None keeps the env's limit."""
    ref_min_score: float | None = None
    """Return that normalises to 0 (a random policy's), with `ref_max_score`; overrides the
    dataset's metadata (Minari's MuJoCo datasets carry none)."""
    ref_max_score: float | None = None
    """Return that normalises to 100 (an expert's), with `ref_min_score`."""
    reference: str | None = None
    """`d4rl`: D4RL's random and expert returns for hopper, halfcheetah and walker2d (measured
    on the v2 environments, so approximate on v5); None: the dataset's own scores."""
    asynchronous: bool = False
    """Step the envs in worker processes (pays off for slow physics on several cores)."""
    video: bool = False
    """Record the first episode (rgb_array rendering) as `video.<video_format>`."""
    video_format: str = "gif"
    """`gif` (Pillow) or `mp4` (needs imageio-ffmpeg)."""
    save_plots: bool = False
    """Write PNG figures of the first episode next to results.json: predicted vs real reward
    and return-to-go over the episode, and for each of `plot_steps` every beam of the search,
    the predicted reward/value distributions and the beam scores."""
    plot_steps: list[int] = field(default_factory=lambda: [0, 50])
    """Steps of the first episode whose whole search is plotted with `save_plots`."""
    progress: bool = True
    """Show a progress bar over env steps."""

    VIDEO_FORMATS: typing.ClassVar[tuple[str, ...]] = ("gif", "mp4")
    REFERENCES: typing.ClassVar[tuple[str, ...]] = ("d4rl",)

    def __post_init__(self) -> None:
        check = functools.partial(require, "eval", self)
        check("episodes", lambda x: x >= 1, "at least 1")
        check("num_envs", lambda x: 1 <= x <= MAX_ENVS, f"in [1, {MAX_ENVS}]")
        check("seed", lambda x: x >= 0, "at least 0")
        check("max_episode_steps", lambda x: x is None or x >= 1, "at least 1, or null")
        for name in ("ref_min_score", "ref_max_score"):
            check(name, lambda x: x is None or finite(x), "a finite number, or null")
        check("reference", lambda x: x is None or x in self.REFERENCES, "d4rl, or null")
        check("video_format", lambda x: x in self.VIDEO_FORMATS, "gif or mp4")
        check("plot_steps", lambda x: all(step >= 0 for step in x), "steps >= 0")


@dataclass
class EvaluateConfig:
    checkpoint: str = MISSING
    """tt-train's run directory (the model it handed over, `model.pt`), or a checkpoint file
    (`model.pt`, `checkpoint.pt`, `best_validation.pt`, `best.pt`), or
    `pretrained:<dataset id>`, the pretrained checkpoint of an embedded dataset; with
    `planner=iql`, a critic's `critic.pt`. `behaviour:<dataset id>` plays no checkpoint but the
    policy that made an embedded maze dataset, its noise drawn by `planner.seed`."""
    device: str = "auto"
    """`auto` (cuda when available), `cpu`, `cuda`, ..."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """The episodes to play and what to record of them."""
    planner: PlannerSchema = field(default_factory=PlannerSchema)  # type: ignore[valid-type]
    """The agent that plays: the beam search's settings (PlannerConfig), a preset of
    configs/planner/ (`planner=bc`, `planner=paper`, ...)."""


@dataclass
class CollectConfig:
    datasets: list[str] = field(
        default_factory=lambda: [
            "pendulum/random-v0",
            "pendulum/medium-v0",
            "pendulum/expert-v0",
            "pendulum/medium-replay-v0",
            "pendulum/medium-expert-v0",
        ]
    )
    """Embedded dataset ids to build."""
    episodes: int | None = None
    """Episodes per behaviour policy (medium-expert holds twice as many); None: each suite's
    default (500 for Pendulum and Reacher; Hopper collects up to a transition budget)."""
    seed: int = 0
    """Base seed of reset seeds, action noise and the reference scores."""
    overwrite: bool = False
    """Rebuild a dataset that already exists locally."""

    def __post_init__(self) -> None:
        require("", self, "datasets", lambda x: len(x) > 0, "a list of one dataset id or more")
        require("", self, "episodes", lambda x: x is None or x >= 1, "at least 1, or null")
        require("", self, "seed", lambda x: x >= 0, "at least 0")


OVERRIDES = {"train": list[str], "critic": list[str], "eval": list[str]}
AgentConfig = _schema("AgentConfig", AgentSpec, {"needs": list[str], **OVERRIDES}, ("name",))
"""One agent of a comparison: AgentSpec's needs and overrides (comparison/protocol.py)."""
ComparisonConfig = _schema(
    "ComparisonConfig", ComparisonSpec, {"agents": dict[str, AgentConfig], **OVERRIDES}
)
"""The `compare` group of tt-compare: ComparisonSpec's fields (comparison/protocol.py)."""


@dataclass
class CompareJobConfig:
    file: str | None = None
    """Set by tt-compare itself when it launches its jobs: the jobs file of an interim."""
    index: int = 0
    """Which job of `file` to run."""


@dataclass
class CompareConfig:
    compare: ComparisonConfig = field(default_factory=ComparisonConfig)  # type: ignore[valid-type]
    """The comparison: a preset of configs/compare/ (its dataset, agents and AdaStop's
    settings), whose keys can be overridden (`compare.n=3`)."""
    trainings_dir: str | None = None
    """Where the models and critics are trained (`trainings/`, `critics/`); None: the
    comparison's run directory. Comparisons given the same folder train what they have in
    common once: the same dataset, training overrides and seed. Continue a comparison with
    the folder it started with, or it trains its models again."""
    stop_after: int | None = None
    """Stop once this many interims are scored, those of earlier runs included, and write the
    tables and figures of the decisions so far (undecided ones read `continue`); a run with
    nothing left to play before it only writes them. None: play until AdaStop has decided
    or `compare.K` interims are scored. The same command without it continues."""
    train_ahead: bool = False
    """Train every model and critic the comparison can use, every agent's seeds of all its
    interims (the first `stop_after` with it), then stop: nothing is evaluated or decided. On
    a machine made for training (a GPU, many cores), ahead of the comparison on another: copy
    `trainings/` and `critics/` (or `trainings_dir`) there, and the same command without
    `train_ahead` finds them finished. The seeds of interims AdaStop never plays are trained
    for nothing."""
    job: CompareJobConfig = field(default_factory=CompareJobConfig)
    """Internal: set by tt-compare on the jobs it launches, never by hand."""
