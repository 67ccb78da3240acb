"""An IQL critic and policy learned from a dataset: values for the planner's beams, and a
baseline agent. Networks, checkpoints and the agent in `model.py` (all that planning and
evaluation import); training in `training.py`."""

from trajectory_transformer.critic.model import (
    CriticCheckpoint,
    IQLAgent,
    IQLCritic,
    IQLPolicy,
    check_critic_matches,
    load_critic,
)

__all__ = [
    "CriticCheckpoint",
    "IQLAgent",
    "IQLCritic",
    "IQLPolicy",
    "check_critic_matches",
    "load_critic",
]
