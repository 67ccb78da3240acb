"""Reference beam search without a cache: the test oracle and the benchmark's baseline.

Deliberately plain: one environment at a time, the whole sequence re-run through the model
for every token, sequences grown with `torch.cat`. It follows `BeamPlanner`'s algorithm and row
order step by step, so with greedy sampling both return the same plans, and for a single
environment they also draw the same random numbers (`SearchNoise`, one env's share).

For a model with value inputs, each token it feeds back carries its decoded value, appended
beside it, where the cached planner reads the same from the model's embedding table.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trajectory_transformer.critic.model import IQLCritic
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.model.gpt import TrajectoryGPT
from trajectory_transformer.planning.config import PlannerConfig
from trajectory_transformer.planning.plan import Plan, build_plan, critic_q
from trajectory_transformer.planning.sampling import SearchNoise, sample_tokens


@torch.inference_mode()
def naive_plan(
    model: TrajectoryGPT,
    discretizer: Discretizer,
    context_tokens: Sequence[torch.Tensor] | torch.Tensor,
    config: PlannerConfig | None = None,
    generator: torch.Generator | None = None,
    action_low: torch.Tensor | None = None,
    action_high: torch.Tensor | None = None,
    critic: IQLCritic | None = None,
    context_values: Sequence[torch.Tensor] | torch.Tensor | None = None,
) -> Plan:
    """Plan for each 1-D context (whole past transitions, then the current observation);
    `critic` ends the scores when `config.value` is `critic` (see `BeamPlanner._score`);
    `context_values` are the contexts' real values (default: what their tokens decode to)."""
    config = (config or PlannerConfig()).resolved()
    if config.value == "critic" and critic is None:
        raise ValueError("planner.value=critic: pass the critic to score with")
    if config.value != "critic":
        critic = None
    if isinstance(context_tokens, torch.Tensor) and context_tokens.ndim == 1:
        context_tokens = [context_tokens]
    if isinstance(context_values, torch.Tensor) and context_values.ndim == 1:
        context_values = [context_values]
    if context_values is None:
        context_values = [None] * len(context_tokens)
    model.eval()
    searches = [
        _search_one(
            model, discretizer, context, real, config, generator, critic, action_low, action_high
        )
        for context, real in zip(context_tokens, context_values, strict=True)
    ]
    tokens, rewards, values, scores = (torch.stack(parts) for parts in zip(*searches, strict=True))
    active = torch.ones(len(searches), dtype=torch.bool, device=tokens.device)
    n_obs = model.config.observation_dim
    return build_plan(
        tokens, rewards, values, scores, active, discretizer, n_obs, action_low, action_high
    )


def _search_one(
    model: TrajectoryGPT,
    discretizer: Discretizer,
    context: torch.Tensor,
    context_values: torch.Tensor | None,
    c: PlannerConfig,
    generator: torch.Generator | None,
    critic: IQLCritic | None,
    action_low: torch.Tensor | None,
    action_high: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    n_obs, n_act = model.config.observation_dim, model.config.action_dim
    T = model.config.transition_dim
    B, X, H = c.beam_width, c.n_expand, c.horizon
    base = context.numel() - n_obs

    def next_logits(sequences: torch.Tensor) -> torch.Tensor:
        return model(sequences, real)[:, -1]  # (rows, N), the whole prefix every time

    def extend(sequences: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """The sequences with `token` (rows,) appended, and its decoded value beside it."""
        nonlocal real
        dim = sequences.shape[1] % T
        decoded = discretizer.decode(token[:, None], slice(dim, dim + 1))
        real = torch.cat([real, decoded], dim=1)
        return torch.cat([sequences, token[:, None]], dim=1)

    sampling = c.token_sampling()
    noise = SearchNoise(sampling, n_act, n_obs, model.config.n_bins, 1, B, X, H, context.device)
    noise.draw([generator])
    h = 0  # the transition being planned

    def sample(logits: torch.Tensor, kind: str, index: int = 0) -> torch.Tensor:
        return sample_tokens(logits, noise.rows(kind, index, h), **sampling[kind])

    def expected(logits: torch.Tensor, dim: int) -> torch.Tensor:
        probs = (logits / c.temperature).softmax(dim=-1)
        return discretizer.expectation(probs, dim, c.value_percentile)

    sequences = context[None].repeat(B * X, 1)  # (rows, len)
    if context_values is None:  # what the context's tokens decode to
        dims = torch.arange(context.numel(), device=context.device) % T
        context_values = discretizer.values[dims, context]
    real = context_values.to(torch.float32)[None].repeat(B * X, 1)  # (rows, len)
    rewards = torch.zeros(B * X, H, device=context.device)
    values = torch.zeros(B * X, H, device=context.device)
    so_far = torch.zeros(B * X, device=context.device)
    log_likelihood = torch.zeros(B * X, device=context.device)
    for h in range(H):
        for j in range(n_act):
            logits = next_logits(sequences)
            token = sample(logits, "act", j)
            if c.value == "likelihood":
                log_p = logits.log_softmax(-1).gather(-1, token[:, None])[:, 0]
                log_likelihood = log_likelihood + log_p
            sequences = extend(sequences, token)
        logits = next_logits(sequences)
        reward = expected(logits, n_obs + n_act)
        sequences = extend(sequences, sample(logits, "reward"))
        logits = next_logits(sequences)
        value = expected(logits, n_obs + n_act + 1)
        sequences = extend(sequences, sample(logits, "value"))
        if c.value == "likelihood":  # the actions' log-probability
            rewards[:, h], values[:, h] = reward, value
            candidate_scores = log_likelihood
        elif critic is None:
            rewards[:, h], values[:, h] = reward, value
            so_far = so_far + c.discount**h * reward
            candidate_scores = so_far + c.discount ** (h + 1) * value
        else:  # Q(s_h, a_h) of the transition just planned, rewards before it in its units
            q = critic_q(critic, discretizer, sequences[:, -T:-2], n_obs, action_low, action_high)
            rewards[:, h], values[:, h] = reward, q
            candidate_scores = so_far + c.discount**h * q
            so_far = so_far + c.discount**h * critic.scale_rewards(reward)
        scores, chosen = candidate_scores.topk(B)  # (B,)
        sequences, rewards, values = sequences[chosen], rewards[chosen], values[chosen]
        real = real[chosen]
        so_far, log_likelihood = so_far[chosen], log_likelihood[chosen]
        if h == H - 1:
            break
        for i in range(n_obs):
            sequences = extend(sequences, sample(next_logits(sequences), "obs", i))
        sequences, rewards, values, real = (
            t.repeat(X, *[1] * (t.ndim - 1)) for t in (sequences, rewards, values, real)
        )
        so_far, log_likelihood = so_far.repeat(X), log_likelihood.repeat(X)
    tokens = sequences[:, base:].reshape(B, H, T)
    return tokens, rewards, values, scores
