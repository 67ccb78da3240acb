"""Measurements of a trained model and of its plans, for `viz` and the notebooks.

Per-dimension token accuracy, attention maps over a context, the prediction error as a
function of how many transitions the model has imagined on its own, and the predicted reward
and value distributions along a chosen plan. Everything here runs the plain full forward pass
(no cache), so it also checks what the planner computed with its cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trajectory_transformer.checkpoint import Checkpoint, value_targets_of
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import joint_transitions
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.evaluation.record import PlanSnapshot
from trajectory_transformer.model.gpt import TrajectoryGPT

# Dimension names of environments whose observations are known, by env id prefix.
KNOWN_DIMENSIONS = {
    "Pendulum": (["cos θ", "sin θ", "θ̇ (rad/s)"], ["torque (N·m)"]),
}


def dimension_names(observation_dim: int, action_dim: int, env_id: str | None = None) -> list[str]:
    """A name for each of the T = O + A + 2 transition dimensions."""
    for prefix, (obs, act) in KNOWN_DIMENSIONS.items():
        shape_matches = (len(obs), len(act)) == (observation_dim, action_dim)
        if env_id and env_id.startswith(prefix) and shape_matches:
            return [*obs, *act, "reward", "value"]
    obs = [f"obs {i}" for i in range(observation_dim)]
    act = [f"act {i}" for i in range(action_dim)]
    return [*obs, *act, "reward", "value"]


def dataset_tokens(checkpoint: Checkpoint) -> tuple[np.ndarray, TokenWindows]:
    """The checkpoint's dataset as it was trained on: the joint transitions (N, T) and their
    token windows of the model's length."""
    episodes, _ = load_episodes(checkpoint.dataset.dataset_id)
    transitions = joint_transitions(episodes, *value_targets_of(checkpoint.config))
    windows = TokenWindows(
        transitions,
        episodes.lengths,
        checkpoint.discretizer.to("cpu"),
        checkpoint.model.config.sequence_transitions,
    )
    return transitions, windows


class _eval_mode:
    """Eval mode (no dropout) for the duration of a block, restoring the previous mode."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.was_training = model, model.training

    def __enter__(self) -> None:
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        self.model.train(self.was_training)


def sample_windows(windows: TokenWindows, count: int, seed: int = 0) -> torch.Tensor:
    """Up to `count` windows (B, L * T) lying wholly inside an episode, chosen at random."""
    full = windows.valid[windows.starts[:, None] + torch.arange(windows.sequence_transitions)]
    ids = torch.nonzero(full.all(dim=1))[:, 0]
    if len(ids) == 0:
        raise ValueError(
            f"no episode is {windows.sequence_transitions} transitions long; diagnostics need "
            "whole windows"
        )
    generator = torch.Generator().manual_seed(seed)
    ids = ids[torch.randperm(len(ids), generator=generator)[:count]]
    return windows.batch(ids)[0]


@dataclass
class TokenAccuracy:
    top1: np.ndarray
    """(T,) share of tokens whose most likely prediction is the true bin."""
    within_one: np.ndarray
    """(T,) share predicted within one bin of the true one."""
    tokens: int
    """Tokens scored per dimension (the first observation token of a window has no
    prediction, so dimension 0 has fewer)."""


@torch.inference_mode()
def token_accuracy(
    model: TrajectoryGPT, windows: torch.Tensor, batch_size: int = 256
) -> TokenAccuracy:
    """Teacher-forced next-token accuracy per transition dimension over windows (B, L * T)."""
    T = model.config.transition_dim
    hits = torch.zeros(T)
    near = torch.zeros(T)
    counts = torch.zeros(T)
    device = model.head_weight.device
    with _eval_mode(model):
        for batch in windows.split(batch_size):
            batch = batch.to(device)
            predicted = model(batch[:, :-1]).argmax(dim=-1).cpu()  # (b, S - 1)
            target = batch[:, 1:].cpu()
            dims = torch.arange(1, batch.shape[1]) % T  # dimension of each target position
            dims = dims.expand_as(target).reshape(-1)
            hits += torch.bincount(dims, (predicted == target).reshape(-1).float(), T)
            close = ((predicted - target).abs() <= 1).reshape(-1).float()
            near += torch.bincount(dims, close, T)
            counts += torch.bincount(dims, minlength=T).float()
    return TokenAccuracy(
        top1=(hits / counts).numpy(),
        within_one=(near / counts).numpy(),
        tokens=int(counts.min()),
    )


@torch.inference_mode()
def attention_maps(model: TrajectoryGPT, tokens: torch.Tensor) -> torch.Tensor:
    """Attention probabilities (layers, heads, S, S) of one sequence (S,) of tokens.

    The queries and keys are captured from each block's input projection during a normal
    forward pass, then scored under the model's own attention mask, so masked entries (later
    tokens, and the value tokens of earlier transitions) are exactly zero.
    """
    captured: list[torch.Tensor] = []
    hooks = [
        block.attn.c_attn.register_forward_hook(lambda _m, _i, out: captured.append(out))
        for block in model.blocks
    ]
    try:
        with _eval_mode(model):
            model(tokens[None].to(model.head_weight.device))
    finally:
        for hook in hooks:
            hook.remove()
    S, nh = tokens.shape[0], model.config.n_head
    maps = []
    for qkv in captured:
        q, k, _ = qkv[0].split(model.config.embedding_dim, dim=-1)  # (S, C) each
        q = q.view(S, nh, -1).transpose(0, 1)  # (nh, S, hs)
        k = k.view(S, nh, -1).transpose(0, 1)
        scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # (nh, S, S)
        scores = scores.masked_fill(~model.mask[:S, :S], float("-inf"))
        maps.append(scores.softmax(dim=-1).cpu())
    return torch.stack(maps)


@dataclass
class CompoundingError:
    """Prediction error per depth: depth d is the d-th transition after the real context."""

    depth: np.ndarray
    """(D,) 1, 2, ..., D."""
    imagined_observation: np.ndarray
    """(D,) mean |predicted - true| observation, in units of each dimension's standard
    deviation, when the model has imagined every observation, reward and value since the
    context (the true actions are fed, as a plan feeds its own)."""
    one_step_observation: np.ndarray
    """(D,) the same error when every earlier token is the true one (teacher forcing)."""
    imagined_reward: np.ndarray
    """(D,) mean |predicted - true| reward, imagined since the context."""
    one_step_reward: np.ndarray
    """(D,) the same, teacher-forced."""


@torch.inference_mode()
def compounding_error(
    model: TrajectoryGPT,
    discretizer: Discretizer,
    windows: torch.Tensor,
    context_transitions: int = 1,
) -> CompoundingError:
    """One-step versus imagined prediction error over windows (B, L * T) of true tokens.

    Each window's first `context_transitions` transitions are given; every later observation,
    reward and value token is then the model's most likely one (as the planner's default
    `k_obs=1` picks observations), while actions stay the true ones. Errors are measured on
    decoded token values, so the discretisation itself costs nothing here.
    """
    c = model.config
    O, A, T = c.observation_dim, c.action_dim, c.transition_dim  # noqa: E741
    L = windows.shape[1] // T
    if not 0 < context_transitions < L:
        raise ValueError(f"context_transitions must be in [1, {L - 1}] for windows of {L}")
    device = model.head_weight.device
    true = windows.to(device)
    imagined = true.clone()
    with _eval_mode(model):
        one_step = model(true[:, :-1]).argmax(dim=-1)  # (B, S - 1): prediction of token i + 1
        for t in range(context_transitions, L):
            for i in [*range(O), O + A, O + A + 1]:  # observation, reward and value tokens
                position = t * T + i
                imagined[:, position] = model(imagined[:, :position])[:, -1].argmax(dim=-1)
    teacher = torch.cat([true[:, :1], one_step], dim=1)  # aligned with `true`

    def decoded(tokens: torch.Tensor) -> torch.Tensor:  # (B, L, T) values
        return discretizer.decode(tokens.view(-1, L, T).cpu())

    truth, dreamt, forced = decoded(true), decoded(imagined), decoded(teacher)
    scale = truth[..., :O].reshape(-1, O).std(dim=0).clamp_min(1e-6)
    rows = slice(context_transitions, L)

    def obs_error(values: torch.Tensor) -> np.ndarray:
        error = (values[:, rows, :O] - truth[:, rows, :O]).abs() / scale
        return error.mean(dim=(0, 2)).numpy()

    def reward_error(values: torch.Tensor) -> np.ndarray:
        return (values[:, rows, O + A] - truth[:, rows, O + A]).abs().mean(dim=0).numpy()

    return CompoundingError(
        depth=np.arange(1, L - context_transitions + 1),
        imagined_observation=obs_error(dreamt),
        one_step_observation=obs_error(forced),
        imagined_reward=reward_error(dreamt),
        one_step_reward=reward_error(forced),
    )


@dataclass
class PlanDistributions:
    """The model's predicted distributions along a plan's chosen beam."""

    rewards: np.ndarray
    """(H, N) probability of each reward bin for each planned transition."""
    values: np.ndarray
    """(H, N) probability of each value bin after each planned transition."""


@torch.inference_mode()
def plan_distributions(
    model: TrajectoryGPT, snapshot: PlanSnapshot, temperature: float = 1.0
) -> PlanDistributions:
    """Reward and value distributions of the chosen beam, from one full forward pass over the
    context and the beam's tokens (temperature as in the planner's expectations)."""
    c = model.config
    O, A, T = c.observation_dim, c.action_dim, c.transition_dim  # noqa: E741
    plan_tokens = snapshot.plan.tokens[0, snapshot.best]  # (H, T)
    past = snapshot.context[:-O]  # real transitions; the plan starts at the current observation
    sequence = torch.cat([past, plan_tokens.reshape(-1)]).to(model.head_weight.device)
    with _eval_mode(model):
        logits = model(sequence[None])[0] / temperature  # (S, N): position i predicts i + 1
    reward_positions = len(past) + torch.arange(plan_tokens.shape[0]) * T + O + A
    probs = logits.softmax(dim=-1).cpu()
    return PlanDistributions(
        rewards=probs[reward_positions - 1].numpy(),
        values=probs[reward_positions].numpy(),
    )
