"""Configuration schemas: one dataclass per Hydra config group.

Each field is documented here once; the YAML files under `configs/` only set values. The
schemas are registered with Hydra's ConfigStore, so an unknown key in a YAML file or on the
command line is rejected instead of silently ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from trajectory_transformer.data.episodes import DISCOUNT, TERMINAL_PENALTY


@dataclass
class DatasetConfig:
    id: str = "pendulum/medium-expert-v0"
    """Minari dataset id. Local under MINARI_DATASETS_PATH (else ~/.minari/datasets); the
    embedded `pendulum/*` ids are built on demand when missing."""
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
    """What a token decodes to: `mean`, the mean of the training values in its bin (repeated
    quantile edges merged, so a point mass such as a saturated action or a zero reward keeps a
    bin of its own), or `midpoint` of the bin's edges, as the original code did."""


@dataclass
class ModelConfig:
    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide `embedding_dim`."""
    embedding_dim: int = 128
    """Width of the residual stream."""
    dropout: float = 0.1
    """Dropout on embeddings, attention weights and residual branches."""
    sequence_transitions: int = 10
    """Training window in transitions; the block size is this times the transition length."""


@dataclass
class TrainerConfig:
    batch_size: int = 256
    """Windows per optimisation step."""
    learning_rate: float = 6e-4
    """Peak learning rate after warm-up."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    weight_decay: float = 0.1
    """AdamW decay, applied to weight matrices only (not biases, norms, embeddings)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    warmup_fraction: float = 0.05
    """Fraction of the planned training tokens spent warming the learning rate up."""
    min_lr_fraction: float = 0.1
    """Cosine decay floor, as a fraction of the peak learning rate."""
    reference_epochs: float = 50.0
    """Epochs per one million transitions (the paper's rule): epochs = ref * 1e6 / windows."""
    epochs: int | None = None
    """Explicit epoch count; overrides `reference_epochs`."""
    max_steps: int | None = None
    """Stop after this many optimisation steps (caps the epoch-derived length)."""
    observation_weight: float = 1.0
    """Loss weight of observation tokens."""
    action_weight: float = 5.0
    """Loss weight of action tokens."""
    reward_weight: float = 1.0
    """Loss weight of reward tokens."""
    value_weight: float = 1.0
    """Loss weight of value tokens."""
    checkpoint_every: int = 1000
    """Write `checkpoint.pt` every this many steps (and always at the end and on Ctrl-C)."""
    log_every: int = 50
    """Steps between progress-bar and wandb updates."""


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


@dataclass
class TrainConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    seed: int = 0
    """Seed of parameters, batch order and dropout."""
    device: str = "auto"
    """`auto` (cuda when available), `cpu`, `cuda`, `cuda:1`, ..."""
    resume: str | None = None
    """Checkpoint to continue from: optimiser, schedule, RNG and position are restored."""


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
    episodes: int = 500
    """Episodes of 200 steps per policy (medium-expert holds twice as many)."""
    seed: int = 0
    """Base seed of reset seeds, action noise and the reference scores."""
    overwrite: bool = False
    """Rebuild a dataset that already exists locally."""


def register_configs() -> None:
    """Register the schemas so Hydra validates every YAML file and override against them."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="collect_schema", node=CollectConfig)
    cs.store(group="dataset", name="dataset_schema", node=DatasetConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)


class ConfigError(ValueError):
    """A config key that no schema knows."""


def reject_unknown_keys(cfg: Any, prefix: str = "") -> None:
    """Refuse keys that the schema lacks, including those forced in with Hydra's `+key=`."""
    from omegaconf import DictConfig, OmegaConf

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
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
