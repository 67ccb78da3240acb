"""IQL's networks, its checkpoint, and its policy as an evaluation agent.

A critic is twin Q networks, a value network V and a target copy of the Q networks, all
2 x 256 MLPs as in IQL (Kostrikov et al., 2021); the policy is a Gaussian whose mean is a
tanh squashed into the action bounds. Every network takes raw observations and actions: the
observation normalisation it was trained with is part of it (buffers), and the reward
normalisation (`reward_scale * r + reward_bias`) is recorded with it, so its values are in
units of the scaled rewards. Training is in `critic/training.py`.
"""

from __future__ import annotations

import copy
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from trajectory_transformer.checkpoint import CheckpointError, read_stored
from trajectory_transformer.data.minari_source import DatasetInfo

CRITIC_FORMAT = "iql-critic"
"""The `kind` of a critic checkpoint, which a model checkpoint never has."""
CRITIC_FORMAT_VERSION = 2
"""2: the critic records the terminal penalty its rewards carried; 1: raw rewards."""
READABLE_CRITIC_FORMATS = (1, 2)
LOG_STD_RANGE = (-20.0, 2.0)  # IQL's clamp of the policy's log standard deviation


@dataclass(frozen=True)
class CriticShape:
    """What the critic's networks are made of; the data's dimensions come with the dataset."""

    observation_dim: int
    action_dim: int
    hidden_dim: int = 256
    hidden_layers: int = 2


def mlp(inputs: int, outputs: int, hidden_dim: int, hidden_layers: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = inputs
    for _ in range(hidden_layers):
        layers += [nn.Linear(width, hidden_dim), nn.ReLU()]
        width = hidden_dim
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


class _Normalised(nn.Module):
    """Observations standardised by the statistics of the data the network was trained on."""

    def __init__(self, observation_dim: int) -> None:
        super().__init__()
        self.register_buffer("observation_mean", torch.zeros(observation_dim))
        self.register_buffer("observation_std", torch.ones(observation_dim))

    def normalise(self, observations: torch.Tensor) -> torch.Tensor:
        return (observations - self.observation_mean) / self.observation_std


class IQLCritic(_Normalised):
    """Twin Q(s, a), V(s) and the target Q networks. `q` is the smaller twin, as IQL uses it
    for the value's target and the policy's advantage."""

    def __init__(
        self,
        shape: CriticShape,
        discount: float = 0.99,
        reward_scale: float = 1.0,
        reward_bias: float = 0.0,
        terminal_penalty: float = 0.0,
    ) -> None:
        """`terminal_penalty`: what a true termination's reward carried in training (the
        model's `dataset.terminal_penalty`; critics of format 1 trained on raw rewards, 0)."""
        super().__init__(shape.observation_dim)
        self.shape = shape
        self.discount = discount
        self.reward_scale = reward_scale
        self.reward_bias = reward_bias
        self.terminal_penalty = terminal_penalty
        joint = shape.observation_dim + shape.action_dim
        self.q1 = mlp(joint, 1, shape.hidden_dim, shape.hidden_layers)
        self.q2 = mlp(joint, 1, shape.hidden_dim, shape.hidden_layers)
        self.v = mlp(shape.observation_dim, 1, shape.hidden_dim, shape.hidden_layers)
        self.target_q1 = copy.deepcopy(self.q1).requires_grad_(False)
        self.target_q2 = copy.deepcopy(self.q2).requires_grad_(False)

    def twin_q(
        self, observations: torch.Tensor, actions: torch.Tensor, target: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both Q estimates (...,) of raw observations (..., O) and actions (..., A)."""
        joint = torch.cat([self.normalise(observations), actions], dim=-1)
        q1, q2 = (self.target_q1, self.target_q2) if target else (self.q1, self.q2)
        return q1(joint).squeeze(-1), q2(joint).squeeze(-1)

    def q(self, observations: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """min(Q1, Q2) (...,), in units of the scaled rewards."""
        return torch.minimum(*self.twin_q(observations, actions))

    def value(self, observations: torch.Tensor) -> torch.Tensor:
        """V(s) (...,), in units of the scaled rewards."""
        return self.v(self.normalise(observations)).squeeze(-1)

    def scale_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """Rewards in the units the critic was trained in."""
        return self.reward_scale * rewards + self.reward_bias


class IQLPolicy(_Normalised):
    """A Gaussian policy: mean tanh(MLP(s)) mapped into the action bounds, and one learned
    log standard deviation per action dimension, independent of the state (IQL's)."""

    def __init__(
        self, shape: CriticShape, action_low: list[float], action_high: list[float]
    ) -> None:
        super().__init__(shape.observation_dim)
        self.net = mlp(
            shape.observation_dim, shape.action_dim, shape.hidden_dim, shape.hidden_layers
        )
        self.log_std = nn.Parameter(torch.zeros(shape.action_dim))
        low = torch.as_tensor(action_low, dtype=torch.float32)
        high = torch.as_tensor(action_high, dtype=torch.float32)
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ValueError("the IQL policy needs finite action bounds to squash its mean into")
        self.register_buffer("action_centre", (high + low) / 2)
        self.register_buffer("action_half_range", (high - low) / 2)

    def distribution(self, observations: torch.Tensor) -> torch.distributions.Normal:
        squashed = torch.tanh(self.net(self.normalise(observations)))
        mean = self.action_centre + self.action_half_range * squashed
        std = self.log_std.clamp(*LOG_STD_RANGE).exp() * self.action_half_range
        return torch.distributions.Normal(mean, std)

    def log_prob(self, observations: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a | s) (B,), summed over the action's dimensions."""
        return self.distribution(observations).log_prob(actions).sum(-1)

    def act(self, observations: torch.Tensor) -> torch.Tensor:
        """The mean action (B, A): IQL evaluates its policy deterministically."""
        return self.distribution(observations).mean


@dataclass
class CriticCheckpoint:
    critic: IQLCritic
    policy: IQLPolicy
    dataset: DatasetInfo
    config: dict  # the resolved tt-train-critic config
    training: dict | None
    path: Path | None = None


def build_critic_payload(
    critic: IQLCritic,
    policy: IQLPolicy,
    dataset: DatasetInfo,
    config: dict,
    training: dict | None,
) -> dict:
    """Everything a critic checkpoint holds: tensors and plain values only."""
    return {
        "kind": CRITIC_FORMAT,
        "format_version": CRITIC_FORMAT_VERSION,
        "shape": asdict(critic.shape),
        "normalisation": {
            "observation_mean": critic.observation_mean.detach().cpu(),
            "observation_std": critic.observation_std.detach().cpu(),
            "reward_scale": critic.reward_scale,
            "reward_bias": critic.reward_bias,
        },
        "discount": critic.discount,
        "terminal_penalty": critic.terminal_penalty,
        "critic": {k: v.detach().cpu() for k, v in critic.state_dict().items()},
        "policy": {k: v.detach().cpu() for k, v in policy.state_dict().items()},
        "dataset": dataset.to_dict(),
        "config": config,
        "training": training,
    }


def read_critic_payload(path: str | os.PathLike) -> dict:
    """The stored dictionary of a critic checkpoint; a CheckpointError for anything else."""
    missing = f"no critic at {path}; tt-train-critic writes one as <run dir>/critic.pt."
    payload = read_stored(path, "a critic checkpoint", missing)
    if not isinstance(payload, dict) or payload.get("kind") != CRITIC_FORMAT:
        raise CheckpointError(
            f"{path} is not a critic checkpoint (a model checkpoint of tt-train, or another "
            "file); train a critic with `tt-train-critic dataset.id=<the model's dataset>`."
        )
    if payload["format_version"] not in READABLE_CRITIC_FORMATS:
        raise CheckpointError(
            f"{path} is a critic checkpoint of format {payload['format_version']!r}; this "
            f"version reads formats {', '.join(map(str, READABLE_CRITIC_FORMATS))}."
        )
    return payload


def critic_from_payload(payload: dict) -> tuple[IQLCritic, IQLPolicy, DatasetInfo]:
    """The networks of a critic payload, on the CPU, in eval mode."""
    shape = CriticShape(**payload["shape"])
    scales = payload["normalisation"]
    penalty = payload.get("terminal_penalty", 0.0)  # format 1 trained on raw rewards
    critic = IQLCritic(
        shape, payload["discount"], scales["reward_scale"], scales["reward_bias"], penalty
    )
    critic.load_state_dict(payload["critic"])
    dataset = DatasetInfo.from_dict(payload["dataset"])
    policy = IQLPolicy(shape, dataset.action_low, dataset.action_high)
    policy.load_state_dict(payload["policy"])
    return critic.eval(), policy.eval(), dataset


def load_critic(path: str | os.PathLike, device: str | torch.device = "cpu") -> CriticCheckpoint:
    """A critic checkpoint's networks (in eval mode, on `device`) and its dataset."""
    payload = read_critic_payload(path)
    critic, policy, dataset = critic_from_payload(payload)
    return CriticCheckpoint(
        critic=critic.to(device),
        policy=policy.to(device),
        dataset=dataset,
        config=payload["config"],
        training=payload["training"],
        path=Path(path),
    )


def check_critic_matches(critic: DatasetInfo, dataset: DatasetInfo, path: object = None) -> None:
    """Refuse a critic trained on another dataset than `dataset` (the planner's model's): its
    id, or the layout of its observations, differ. One line, which says what to do."""
    differences = [
        f"{name} {getattr(critic, name)!r} (the model's: {getattr(dataset, name)!r})"
        for name in ("dataset_id", "observation_layout", "observation_dim", "action_dim")
        if getattr(critic, name) != getattr(dataset, name)
    ]
    if differences:
        where = f"the critic {path}" if path is not None else "the critic"
        raise CheckpointError(
            f"{where} was trained on another dataset: {'; '.join(differences)}; train one on "
            f"the model's with `tt-train-critic dataset.id={dataset.dataset_id}`."
        )


class IQLAgent:
    """IQL's policy (advantage-weighted regression on the critic) as an evaluation agent:
    `reset`, `act`, `observe`, with the mean action of each env's observation."""

    def __init__(self, policy: IQLPolicy, dataset: DatasetInfo, device: torch.device) -> None:
        self.policy = policy.to(device).eval()
        self.dataset = dataset
        self.device = device
        self.num_envs = 1

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, device: str | torch.device) -> IQLAgent:
        checkpoint = load_critic(path, device)
        return cls(checkpoint.policy, checkpoint.dataset, torch.device(device))

    def reset(self, num_envs: int, seed: int | None = None) -> None:
        self.num_envs = num_envs

    @torch.inference_mode()
    def act(self, observations: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
        obs = torch.as_tensor(observations, dtype=torch.float32, device=self.device)
        actions = self.policy.act(obs).cpu().numpy()  # (E, A)
        if active is not None:
            actions[~np.asarray(active, dtype=bool)] = 0.0
        return actions

    def observe(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        pass  # a Markov policy: nothing to remember
