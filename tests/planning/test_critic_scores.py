"""`planner.value=critic`: beams scored by an IQL critic's Q of their last planned transition,
the same in the batched planner and the naive reference, and only with a critic of the
model's own dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import create_dataset, run_module
from test_beam import OBS, SMALL, T, assert_same_plan, run_steps, tiny_discretizer, tiny_model

from trajectory_transformer.checkpoint import CheckpointError, save_atomic
from trajectory_transformer.critic.model import (
    CriticShape,
    IQLCritic,
    IQLPolicy,
    build_critic_payload,
)
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.planning import BeamPlanner, naive_plan

ACT = T - OBS - 2
SCALE, BIAS = 2.0, -0.5  # a critic trained on rewards 2 r - 0.5


def tiny_critic(
    seed: int = 0,
    observation_dim: int = OBS,
    action_dim: int = ACT,
    discount: float = 0.99,
    terminal_penalty: float = -100.0,
) -> IQLCritic:
    """A deterministic critic with random weights: a fixed function of (s, a), trained (as it
    says) on the model's rewards, terminal penalty included."""
    torch.manual_seed(seed)
    shape = CriticShape(observation_dim, action_dim, hidden_dim=16, hidden_layers=2)
    return IQLCritic(shape, discount, SCALE, BIAS, terminal_penalty).eval()


@pytest.mark.parametrize("dones", [None, {1: [0]}])
def test_greedy_planner_scored_by_a_critic_equals_naive(dones) -> None:
    model, disc, critic = tiny_model(), tiny_discretizer(), tiny_critic()
    bounds = dict(action_low=[-0.5] * ACT, action_high=[0.5] * ACT)
    planner = BeamPlanner(
        model, disc, deterministic=True, value="critic", critic_network=critic, **bounds, **SMALL
    )
    planner.reset(3)
    obs = run_steps(planner, 4, dones)
    plan = planner.plan(obs)
    reference = naive_plan(
        model,
        disc,
        planner.context_tokens(obs),
        planner.config,
        action_low=planner.action_low,
        action_high=planner.action_high,
        critic=critic,
    )
    assert_same_plan(plan, reference)


def test_sampled_single_env_scored_by_a_critic_equals_naive_with_the_same_draws() -> None:
    # As test_beam's sampled test: many bins, flat distributions, so that beams differ.
    model, disc, critic = tiny_model(n_bins=256, scale=2.0), tiny_discretizer(256), tiny_critic()
    plans, contexts = {}, {}
    for value in ("critic", "model"):
        planner = BeamPlanner(model, disc, seed=7, value=value, critic_network=critic, **SMALL)
        planner.reset(1)
        obs = run_steps(planner, 2)
        planner.generators[0].manual_seed(7)
        plans[value] = planner.plan(obs)
        contexts[value] = planner.context_tokens(obs)
    reference = naive_plan(
        model,
        disc,
        contexts["critic"],
        planner.config.with_overrides(value="critic"),
        torch.Generator().manual_seed(7),
        critic=critic,
    )
    assert_same_plan(plans["critic"], reference)
    assert len(torch.unique(reference.tokens[0].flatten(1), dim=0)) > 1  # beams really differ
    # The critic, not the model's value, chose: scored by the model, other beams survive.
    model_scored = naive_plan(
        model, disc, contexts["critic"], planner.config, torch.Generator().manual_seed(7)
    )
    assert not torch.equal(model_scored.tokens, reference.tokens)


def test_a_beams_score_is_its_scaled_rewards_then_the_critics_q_of_its_last_transition():
    model, disc, critic = tiny_model(), tiny_discretizer(), tiny_critic()
    planner = BeamPlanner(model, disc, value="critic", critic_network=critic, seed=3, **SMALL)
    planner.reset(2)
    plan = planner.plan(run_steps(planner, 2))
    H, discount = SMALL["horizon"], planner.config.discount
    with torch.no_grad():
        # Decoded from the plan's tokens, as the plan shows them.
        q_last = critic.q(plan.observations[:, :, -1], plan.beam_actions[:, :, -1])  # (E, B)
    rewards = SCALE * plan.rewards[..., :-1] + BIAS  # (E, B, H - 1)
    discounts = discount ** torch.arange(H - 1, dtype=torch.float32)
    expected = (rewards * discounts).sum(-1) + discount ** (H - 1) * q_last
    torch.testing.assert_close(plan.scores, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plan.values[..., -1], q_last, rtol=1e-5, atol=1e-5)


def test_value_critic_needs_a_critic() -> None:
    with pytest.raises(ValueError, match=r"planner\.value=critic needs planner\.critic="):
        BeamPlanner(tiny_model(), tiny_discretizer(), value="critic", **SMALL)
    with pytest.raises(ValueError, match=r"planner\.value must be model, critic or likelihood"):
        BeamPlanner(tiny_model(), tiny_discretizer(), value="q", **SMALL)
    with pytest.raises(CheckpointError, match="the critic takes 2 observation"):
        BeamPlanner(
            tiny_model(),
            tiny_discretizer(),
            value="critic",
            critic_network=tiny_critic(0, 2),
            **SMALL,
        )


def critic_file(path, dataset_id: str, **settings):
    _, info = load_episodes(dataset_id)
    critic = tiny_critic(0, info.observation_dim, info.action_dim, **settings)
    policy = IQLPolicy(critic.shape, info.action_low, info.action_high)
    return save_atomic(build_critic_payload(critic, policy, info, {}, None), path)


def test_the_planner_refuses_a_critic_of_another_dataset(tmp_path, tiny_checkpoint) -> None:
    create_dataset("test/other-v0")  # the same spaces, another dataset
    other = critic_file(tmp_path / "other" / "critic.pt", "test/other-v0")
    own = critic_file(tmp_path / "own" / "critic.pt", "test/tiny-v0")
    fits = dict(horizon=1, beam_width=2, context_transitions=1)
    planner = BeamPlanner.from_checkpoint(tiny_checkpoint, value="critic", critic=str(own), **fits)
    assert planner.critic is not None
    with pytest.raises(CheckpointError, match="trained on another dataset: dataset_id"):
        BeamPlanner.from_checkpoint(tiny_checkpoint, value="critic", critic=str(other), **fits)

    refused = run_module(
        "trajectory_transformer.cli.evaluate",
        f"checkpoint={tiny_checkpoint}",
        "planner.value=critic",
        f"planner.critic={other}",
        "planner.horizon=1",
        "planner.beam_width=2",
        "planner.context_transitions=1",
        "device=cpu",
        f"hydra.run.dir={tmp_path / 'eval'}",
    )
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "test/other-v0" in lines[0], refused.stderr
    assert "tt-train-critic dataset.id=test/tiny-v0" in lines[0]

    played = run_module(
        "trajectory_transformer.cli.evaluate",
        f"checkpoint={tiny_checkpoint}",
        "planner.value=critic",
        f"planner.critic={own}",
        "planner.horizon=1",
        "planner.beam_width=2",
        "planner.context_transitions=1",
        "eval.episodes=1",
        "eval.max_episode_steps=3",
        "eval.progress=false",
        "device=cpu",
        f"hydra.run.dir={tmp_path / 'eval2'}",
    )
    assert played.returncode == 0, played.stderr[-2000:]
    assert np.isfinite(float(played.stdout.split("return ")[1].split()[0]))


def test_a_critic_search_adds_one_reward_with_one_discount(tmp_path, tiny_checkpoint) -> None:
    """Planned rewards and the critic's Q are added: the search discounts by the critic's
    discount, refuses another one named explicitly, and refuses a critic whose rewards carried
    another terminal penalty than the model's (a critic of format 1 trained on raw ones)."""
    fits = dict(horizon=1, beam_width=2, context_transitions=1, value="critic")
    critic = critic_file(tmp_path / "a" / "critic.pt", "test/tiny-v0", discount=0.9)
    planner = BeamPlanner.from_checkpoint(tiny_checkpoint, critic=str(critic), **fits)
    assert planner.config.discount == 0.9  # the critic's, not the model's 0.99
    with pytest.raises(
        ValueError, match=r"planner\.discount=0\.99 differs .* 0\.9 that the critic"
    ):
        BeamPlanner.from_checkpoint(tiny_checkpoint, critic=str(critic), discount=0.99, **fits)
    raw = critic_file(tmp_path / "b" / "critic.pt", "test/tiny-v0", terminal_penalty=0.0)
    with pytest.raises(CheckpointError, match=r"critic\.terminal_penalty=-100"):
        BeamPlanner.from_checkpoint(tiny_checkpoint, critic=str(raw), **fits)
