"""The Trajectory Transformer's GPT and its key/value cache."""

from trajectory_transformer.model.gpt import GPTConfig, TrajectoryGPT, trajectory_attention_mask
from trajectory_transformer.model.kv_cache import KVCache

__all__ = ["GPTConfig", "KVCache", "TrajectoryGPT", "trajectory_attention_mask"]
