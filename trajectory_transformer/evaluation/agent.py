"""What evaluation and recording ask of a policy, and of whoever watches an evaluation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np
import torch

if TYPE_CHECKING:
    from trajectory_transformer.planning.plan import Plan


class Agent(Protocol):
    """A batched policy: `BeamPlanner` is one, and any object with these methods can be
    evaluated."""

    def reset(self, num_envs: int, seed: int | None = None) -> None:
        """Start `num_envs` new episodes; `seed` names an independent random stream."""

    def reset_env(self, env: int, seed: int | None = None) -> None:
        """Env `env` alone starts a new episode, whose seed `seed` names its random stream.
        (`evaluate` calls it where the agent has it: an agent without state may leave it
        out.)"""

    def act(self, observations: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
        """Actions (E, A) for observations (E, O); `active` marks the envs still playing."""

    def observe(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        """The rewards (E,) of the last `act`, and which envs finished with it."""


@runtime_checkable
class PlanningAgent(Agent, Protocol):
    """An agent that plans, whose searches a recording keeps."""

    @property
    def last_plan(self) -> Plan | None:
        """The search of the latest `act` that planned (a new object for every new search)."""

    def context_tokens(self, observations: np.ndarray | torch.Tensor) -> list[torch.Tensor]:
        """Each env's planning context, 1-D: its kept real transitions, then `observations`."""


class EvaluationObserver(Protocol):
    """Called by `evaluate` at every episode start and around every step."""

    def on_start(
        self,
        slot: int,
        episode: int,
        seed: int,
        observations: np.ndarray,
        env: gym.vector.VectorEnv,
    ) -> None:
        """Episode `episode` (numbered from 0, with `seed`) starts in env `slot`, whose first
        observation is `observations[slot]`."""

    def on_act(
        self, agent: Agent, observations: np.ndarray, actions: np.ndarray, active: np.ndarray
    ) -> None:
        """The agent chose `actions` for `observations`; `active` envs will step with them."""

    def on_step(
        self,
        observations: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        active: np.ndarray,
        env: gym.vector.VectorEnv,
    ) -> None:
        """The envs stepped; `active` were playing before this step."""
