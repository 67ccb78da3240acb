"""What a planning call returns: every beam of every environment, decoded."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trajectory_transformer.critic.model import IQLCritic
from trajectory_transformer.data.discretizer import Discretizer


@dataclass
class Plan:
    """All beams of one planning call for E environments (rows of inactive ones are zeros).

    Transition h of a beam is `observation h | action h | reward h | value h`; observation 0 is
    the real current observation, later ones are imagined. Beams are sorted best first.
    """

    tokens: torch.Tensor
    """(E, beams, H, T) int64 sampled tokens."""
    observations: torch.Tensor
    """(E, beams, H, O) decoded values of the observation tokens."""
    beam_actions: torch.Tensor
    """(E, beams, H, A) decoded values of the action tokens, clipped to the action bounds."""
    rewards: torch.Tensor
    """(E, beams, H) expected reward (or percentile) that the score used; with
    `goal_reward_radius`, 1 where the transition starts within it of the goal, else 0."""
    values: torch.Tensor
    """(E, beams, H) expected value (or percentile) after each transition; with
    `value=critic`, the critic's Q(s_h, a_h) of each transition instead."""
    scores: torch.Tensor
    """(E, beams) sum_h discount^h reward_h + discount^H value_{H-1}; with `value=critic`,
    sum_{h<H-1} discount^h r'_h + discount^(H-1) Q(s_{H-1}, a_{H-1}), r' being the reward in
    the critic's units."""
    best: torch.Tensor
    """(E,) int64 index of the best beam."""
    actions: torch.Tensor
    """(E, H, A) actions of the best beam; `actions[:, 0]` is executed."""
    active: torch.Tensor
    """(E,) bool, environments that were planned."""


def build_plan(
    tokens: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    scores: torch.Tensor,
    active: torch.Tensor,
    discretizer: Discretizer,
    observation_dim: int,
    action_low: torch.Tensor | None = None,
    action_high: torch.Tensor | None = None,
) -> Plan:
    """Decode the tokens (E, B, H, T) of a search into a `Plan`."""
    n_obs = observation_dim
    n_act = tokens.shape[-1] - n_obs - 2
    observations = discretizer.decode(tokens[..., :n_obs], slice(0, n_obs))  # (E, B, H, O)
    actions = discretizer.decode(
        tokens[..., n_obs : n_obs + n_act], slice(n_obs, n_obs + n_act)
    )  # (E, B, H, A)
    if action_low is not None and action_high is not None:
        actions = torch.maximum(torch.minimum(actions, action_high), action_low)
    best = scores.argmax(dim=-1)  # (E,)
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    return Plan(
        tokens=tokens,
        observations=observations,
        beam_actions=actions,
        rewards=rewards,
        values=values,
        scores=scores,
        best=best,
        actions=actions[rows, best],
        active=active,
    )


def critic_q(
    critic: IQLCritic,
    discretizer: Discretizer,
    tokens: torch.Tensor,
    observation_dim: int,
    action_low: torch.Tensor | None = None,
    action_high: torch.Tensor | None = None,
) -> torch.Tensor:
    """The critic's Q (rows,) of planned transitions given as their observation and action
    tokens (rows, O + A): decoded in one call as the plan decodes them (actions clipped to
    their bounds), then one batched pass of the critic."""
    decoded = discretizer.decode(tokens, slice(0, tokens.shape[-1]))  # (rows, O + A)
    observations, actions = decoded[:, :observation_dim], decoded[:, observation_dim:]
    if action_low is not None and action_high is not None:
        actions = torch.maximum(torch.minimum(actions, action_high), action_low)
    return critic.q(observations, actions)
