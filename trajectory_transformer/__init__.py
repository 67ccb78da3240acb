"""Trajectory Transformer: offline RL as sequence modelling, with a batched, cached planner."""

# First, before anything imports torch: the OpenMP wait policy is read when torch loads.
from trajectory_transformer import threads  # noqa: F401  # isort: skip

from trajectory_transformer.checkpoint import Checkpoint, load_checkpoint
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.minari_source import DatasetInfo, load_episodes
from trajectory_transformer.evaluation import evaluate, make_vector_env
from trajectory_transformer.model import GPTConfig, KVCache, TrajectoryGPT
from trajectory_transformer.planning import BeamPlanner, Plan, PlannerConfig

__all__ = [
    "BeamPlanner",
    "Checkpoint",
    "DatasetInfo",
    "Discretizer",
    "GPTConfig",
    "KVCache",
    "Plan",
    "PlannerConfig",
    "TrajectoryGPT",
    "evaluate",
    "load_checkpoint",
    "load_episodes",
    "make_vector_env",
]
