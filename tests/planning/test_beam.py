"""BeamPlanner: equals the naive reference, reorders beams and cache rows consistently, keeps
whole-transition contexts, masks finished envs, and works from a checkpoint."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import cuda_only, set_discretizer_values, tiny_gpt

from trajectory_transformer.checkpoint import build_payload, save_atomic
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.minari_source import DatasetInfo
from trajectory_transformer.model import TrajectoryGPT
from trajectory_transformer.planning import BeamPlanner, Plan, PlannerConfig, naive_plan
from trajectory_transformer.planning.config import MIN_TEMPERATURE

OBS, ACT, N = 3, 2, 11
T = OBS + ACT + 2
SMALL = dict(horizon=3, beam_width=4, n_expand=2, context_transitions=2, cdf_act=0.9, k_obs=2)


def tiny_model(
    seed: int = 0,
    sequence_transitions: int = 6,
    n_bins: int = N,
    scale: float = 8.0,
    value_inputs: bool = False,
    observation_vector: bool = False,
) -> TrajectoryGPT:
    model = tiny_gpt(
        OBS,
        ACT,
        n_bins,
        sequence_transitions,
        seed,
        value_inputs=value_inputs,
        observation_vector=observation_vector,
    )
    with torch.no_grad():  # larger weights than the init, so that beams and tokens differ
        for p in model.parameters():
            p.mul_(scale)
    return model


def tiny_discretizer(n_bins: int = N) -> Discretizer:
    data = np.random.default_rng(0).normal(size=(500, T))
    return Discretizer.fit(data, n_bins=n_bins, strategy="quantile")


def run_steps(planner: BeamPlanner, steps: int, dones: dict[int, list[int]] | None = None):
    """Act and observe for `steps` steps on random observations; returns the next observation.
    An env done at a step starts its next episode with the next observation (gymnasium's
    `SAME_STEP` autoreset)."""
    planner.autoreset_mode = gym.vector.AutoresetMode.SAME_STEP
    rng = np.random.default_rng(1)
    E = planner.num_envs
    for step in range(steps):
        planner.act(rng.normal(size=(E, OBS)))
        done = np.zeros(E, dtype=bool)
        done[(dones or {}).get(step, [])] = True
        planner.observe(rng.normal(size=E), done)
    return rng.normal(size=(E, OBS)).astype(np.float32)


def assert_same_plan(a: Plan, b: Plan) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert torch.allclose(a.scores, b.scores, atol=1e-5)
    assert torch.allclose(a.rewards, b.rewards, atol=1e-5)
    assert torch.allclose(a.values, b.values, atol=1e-5)
    assert torch.equal(a.actions, b.actions)


def test_refuses_context_and_horizon_beyond_the_block_size() -> None:
    model = tiny_model(sequence_transitions=6)
    with pytest.raises(ValueError, match=r"4 \+ 3 transitions of 7 tokens = 49 tokens.*42"):
        BeamPlanner(model, tiny_discretizer(), context_transitions=4, horizon=3)
    BeamPlanner(model, tiny_discretizer(), context_transitions=3, horizon=3)  # fits exactly
    with pytest.raises(ValueError, match="unknown planner settings"):
        BeamPlanner(model, tiny_discretizer(), beam=3)


PLANNER_PATHS = [
    ("cpu", "eager", "step"),  # nothing is captured on the CPU
    *(
        pytest.param("cuda", decode, cuda_graph, marks=cuda_only)
        for decode, cuda_graph in [
            ("eager", "none"),
            ("eager", "step"),
            ("eager", "search"),
            ("compile", "step"),
            ("compile", "search"),
            ("fused", "step"),
            ("fused", "search"),
        ]
    ),
]
"""Each device, decode and capture that a planner test compares with the reference."""


@pytest.mark.parametrize("device, decode, cuda_graph", PLANNER_PATHS)
@pytest.mark.parametrize("dones", [None, {1: [0], 3: [2]}])
def test_greedy_planner_equals_naive_with_mixed_and_cropped_histories(
    dones, device, decode, cuda_graph
):
    planner = BeamPlanner(
        tiny_model(),
        tiny_discretizer(),
        device=device,
        deterministic=True,
        decode=decode,
        cuda_graph=cuda_graph,
        **SMALL,
    )
    model, disc = planner.model, planner.discretizer
    planner.reset(3)
    obs = run_steps(planner, 5, dones)
    contexts = planner.context_tokens(obs)
    lengths = [len(c) for c in contexts]
    assert lengths == ([2 * T + OBS] * 3 if dones is None else [2 * T + OBS, 2 * T + OBS, T + OBS])
    plan = planner.plan(obs)
    reference = naive_plan(model, disc, contexts, planner.config)
    assert_same_plan(plan, reference)
    assert plan.tokens.shape == (3, 4, 3, T)
    # The plan starts from the real observation.
    assert torch.equal(
        plan.tokens[:, :, 0, :OBS],
        torch.stack([c[-OBS:] for c in contexts])[:, None].expand(3, 4, OBS),
    )
    assert plan.tokens.device.type == device


@pytest.mark.parametrize(
    "value_inputs, observation_vector", [(False, False), (True, False), (True, True)]
)
def test_greedy_planner_with_the_fused_step_equals_naive(
    fused_device, value_inputs, observation_vector
):
    # On CUDA the whole search is captured around the fused step.
    disc = tiny_discretizer()
    model = tiny_model(value_inputs=value_inputs, observation_vector=observation_vector)
    if value_inputs:
        set_discretizer_values(model, disc)
    planner = BeamPlanner(
        model,
        disc,
        device=fused_device,
        deterministic=True,
        decode="fused",
        cuda_graph="search",
        **{**SMALL, "horizon": 2},
    )
    planner.reset(2)
    obs = run_steps(planner, 1, {0: [0]})  # two history lengths: two groups of envs
    plan = planner.plan(obs)
    reference = naive_plan(
        planner.model,
        planner.discretizer,
        planner.context_tokens(obs),
        planner.config,
        context_values=planner.context_values(obs),
    )
    assert_same_plan(plan, reference)


@pytest.mark.parametrize("observation_vector", [False, True])
@pytest.mark.parametrize("device, decode, cuda_graph", PLANNER_PATHS)
def test_a_planner_with_value_inputs_equals_naive_given_the_real_context(
    device, decode, cuda_graph, observation_vector
):
    """The context carries the real values seen (the observations, the actions played, the
    rewards); every token the search feeds back carries what it decodes to, which the naive
    reference appends beside it. With the observation vector, each planned transition's is
    that of its decoded observation, the current one's that of the real observation."""
    disc = tiny_discretizer()
    model = tiny_model(value_inputs=True, observation_vector=observation_vector)
    model = set_discretizer_values(model, disc)
    settings = dict(deterministic=True, decode=decode, cuda_graph=cuda_graph, **SMALL)
    planner = BeamPlanner(model, disc, device=device, **settings)
    planner.reset(3)
    obs = run_steps(planner, 5, {3: [2]})
    contexts, values = planner.context_tokens(obs), planner.context_values(obs)
    plan = planner.plan(obs)
    assert_same_plan(plan, naive_plan(model, disc, contexts, planner.config, context_values=values))
    # The real values matter: given what the context's tokens decode to, another plan.
    decoded = naive_plan(model, disc, contexts, planner.config)
    assert not torch.allclose(plan.scores, decoded.scores, atol=1e-3)


def test_the_fused_step_is_refused_where_it_cannot_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"planner.decode=fused cannot run here: it runs on CUDA"):
        BeamPlanner(tiny_model(), tiny_discretizer(), decode="fused", **SMALL)


@pytest.mark.parametrize("value", ["model", "likelihood"])
@pytest.mark.parametrize("feedback", ["greedy", "sample"])
@pytest.mark.parametrize("history", [0, 1, 2])
def test_sampled_single_env_equals_naive_with_the_same_draws(
    history: int, feedback: str, value: str
) -> None:
    """Scored by the model's values or by the likelihood of the planned actions."""
    # Many bins and flatter distributions: with few, peaked ones, candidates often repeat, and
    # which of two equal-scoring copies survives (and so which later draws it gets) would
    # hinge on float rounding, which differs between the cached and the full-sequence paths.
    model, disc = tiny_model(n_bins=256, scale=2.0), tiny_discretizer(n_bins=256)
    feedback_tokens = dict(reward_token=feedback, value_token=feedback)
    planner = BeamPlanner(model, disc, seed=7, value=value, **SMALL, **feedback_tokens)
    planner.reset(1)
    obs = run_steps(planner, history)
    planner.generators[0].manual_seed(7)
    plan = planner.plan(obs)
    reference = naive_plan(
        model, disc, planner.context_tokens(obs), planner.config, torch.Generator().manual_seed(7)
    )
    assert_same_plan(plan, reference)
    assert len(torch.unique(plan.tokens[0].flatten(1), dim=0)) > 1  # beams really differ


def test_same_seed_same_plan_other_seed_other_plan() -> None:
    model, disc = tiny_model(), tiny_discretizer()
    obs = np.random.default_rng(0).normal(size=(2, OBS))
    plans = []
    for seed in (3, 3, 4):
        planner = BeamPlanner(model, disc, seed=seed, **SMALL)
        planner.reset(2)
        plans.append(planner.plan(obs))
    assert_same_plan(plans[0], plans[1])
    assert not torch.equal(plans[0].tokens, plans[2].tokens)


@torch.inference_mode()
def test_beam_reorder_matches_a_recompute_of_the_selected_tokens() -> None:
    model, disc = tiny_model(), tiny_discretizer()
    # Sampled feedback as well as sampled actions, so that the final beams differ.
    config = PlannerConfig(
        **{**SMALL, "horizon": 4, "beam_width": 5, "n_expand": 3},
        reward_token="sample",
        value_token="sample",
    )
    planner = BeamPlanner(model, disc, config)
    G, n, B, H = 2, 1, 5, 4
    context = torch.randint(0, N, (G, n * T + OBS), generator=torch.Generator().manual_seed(5))
    cache = model.new_shared_prefix_cache(G, B, G * B * 3, n * T + OBS, H * T - OBS)
    search = planner._search(context, cache, [torch.Generator().manual_seed(g) for g in range(G)])
    assert len(torch.unique(search.tokens.flatten(1, -1)[0], dim=0)) > 1

    past = context[:, None, : n * T].expand(G, B, -1)  # the plan repeats the observation
    full = torch.cat([past, search.tokens.flatten(2)], dim=2)
    full = full.reshape(G * B, -1)  # (G*B, (n+H)*T) context and plan of every final beam
    logits = model(full).view(G, B, n + H, T, N)[:, :, n:]  # (G, B, H, T, N)
    # Logits at the last action token predict the reward; at the reward, the value.
    reward = disc.expectation(logits[..., OBS + ACT - 1, :].softmax(-1), OBS + ACT)
    value = disc.expectation(logits[..., OBS + ACT, :].softmax(-1), OBS + ACT + 1)
    assert torch.allclose(search.rewards, reward, atol=1e-5)
    assert torch.allclose(search.values, value, atol=1e-5)
    discounts = planner.config.discount ** torch.arange(H + 1.0)
    score = (reward * discounts[:H]).sum(-1) + discounts[H] * value[..., -1]
    assert torch.allclose(search.scores, score, atol=1e-5)
    assert (search.scores[:, :-1] >= search.scores[:, 1:]).all()  # best first

    # The final beams' cache (their env's shared context, then their own planned positions)
    # holds exactly the keys/values of their tokens.
    fresh = model.new_cache(G * B, (n + H) * T)
    written = (n + H) * T - 1  # the last value token is sampled, never decoded
    model.prefill(full[:, :written], fresh)
    C = context.shape[1]
    assert cache.prefix_length == C
    env = torch.arange(G).repeat_interleave(B)
    for shared, own, plain in (
        (cache.prefix.keys, cache.own.keys, fresh.keys),
        (cache.prefix.values, cache.own.values, fresh.values),
    ):
        kept = torch.cat([shared[:, env, :, :C], own[:, search.rows, :, : written - C]], dim=3)
        assert torch.allclose(kept, plain[:, :, :, :written], rtol=1e-4, atol=1e-4)


def test_context_keeps_whole_recent_transitions() -> None:
    model, disc = tiny_model(), tiny_discretizer()
    planner = BeamPlanner(model, disc, **SMALL)
    planner.reset(2)
    rng = np.random.default_rng(4)
    seen = []
    for step in range(4):
        obs = rng.normal(size=(2, OBS)).astype(np.float32)
        actions = planner.act(obs)
        rewards = rng.normal(size=2).astype(np.float32)
        planner.observe(rewards, np.array([False, step == 3]))
        seen.append((obs, actions, rewards))
    obs = rng.normal(size=(2, OBS)).astype(np.float32)
    context = planner.context_tokens(obs)
    assert len(context[0]) == 2 * T + OBS  # cropped to context_transitions
    assert len(context[1]) == OBS  # done: starts afresh
    past = context[0][:-OBS].view(2, T)
    for row, (o, a, r) in zip(past, seen[-2:], strict=True):
        assert torch.equal(row[:OBS], disc.encode(torch.as_tensor(o[0]), slice(0, OBS)))
        decoded = disc.decode(row[OBS : OBS + ACT], slice(OBS, OBS + ACT))
        assert torch.allclose(decoded, torch.as_tensor(a[0]))  # the executed action
        assert row[OBS + ACT] == disc.encode(torch.tensor([r[0]]), slice(OBS + ACT, T - 1))[0]
        assert row[-1] == 0  # value placeholder
    assert torch.equal(context[0][-OBS:], disc.encode(torch.as_tensor(obs[0]), slice(0, OBS)))
    # The real values beside them, exactly as seen; the placeholder's is what it decodes to.
    values = planner.context_values(obs)
    assert [len(v) for v in values] == [len(c) for c in context]
    past = values[0][:-OBS].view(2, T)
    for row, (o, a, r) in zip(past, seen[-2:], strict=True):
        assert torch.equal(row[: OBS + ACT + 1], torch.as_tensor(np.r_[o[0], a[0], r[0]]))
        assert row[-1] == disc.values[-1, 0]
    assert torch.equal(values[0][-OBS:], torch.as_tensor(obs[0]))


def test_inactive_envs_are_masked_without_changing_the_others() -> None:
    model, disc = tiny_model(), tiny_discretizer()
    obs = np.random.default_rng(0).normal(size=(3, OBS))
    plans = []
    for active in (None, np.array([True, False, True])):
        planner = BeamPlanner(model, disc, seed=1, **SMALL)
        planner.reset(3)
        plans.append(planner.plan(obs, active=active))
    full, masked = plans
    assert masked.tokens.shape == full.tokens.shape
    assert masked.active.tolist() == [True, False, True]
    for e in (0, 2):
        assert torch.equal(masked.tokens[e], full.tokens[e])
        torch.testing.assert_close(masked.scores[e], full.scores[e], atol=1e-5, rtol=1e-6)
    assert (masked.tokens[1] == 0).all() and (masked.scores[1] == 0).all()

    planner = BeamPlanner(model, disc, seed=1, **SMALL)
    planner.reset(3)
    actions = planner.act(obs, active=np.array([True, False, True]))
    assert actions.shape == (3, ACT) and (actions[1] == 0).all()


def tiny_checkpoint(path, config: dict | None = None) -> None:
    model, disc = tiny_model(), tiny_discretizer()
    dataset = DatasetInfo(
        dataset_id="test/tiny-v0",
        eval_env_spec=None,
        eval_env_id="Pendulum-v1",
        observation_dim=OBS,
        action_dim=ACT,
        action_low=[-0.5, -1.0],
        action_high=[0.5, 1.0],
        ref_min_score=None,
        ref_max_score=None,
        num_episodes=1,
        num_transitions=500,
    )
    save_atomic(build_payload(model, disc, dataset, config or {}, None), path)


def test_the_discount_defaults_to_the_one_the_value_targets_were_built_with(tmp_path) -> None:
    path = tmp_path / "checkpoint.pt"
    tiny_checkpoint(path, {"dataset": {"discount": 0.9, "terminal_penalty": -100.0}})
    assert BeamPlanner.from_checkpoint(path, **SMALL).config.discount == 0.9
    assert BeamPlanner.from_checkpoint(path, discount=None, **SMALL).config.discount == 0.9
    assert BeamPlanner.from_checkpoint(path, discount=0.95, **SMALL).config.discount == 0.95
    tiny_checkpoint(path)  # a config that names no discount was trained with the default
    assert BeamPlanner.from_checkpoint(path, **SMALL).config.discount == 0.99
    assert BeamPlanner(tiny_model(), tiny_discretizer(), **SMALL).config.discount == 0.99


def test_act_observe_plan_on_a_checkpoint(tmp_path) -> None:
    path = tmp_path / "checkpoint.pt"
    tiny_checkpoint(path)
    planner = BeamPlanner.from_checkpoint(path, plan_every=2, **SMALL)
    assert planner.config.plan_every == 2 and planner.dataset.dataset_id == "test/tiny-v0"
    planner.reset(num_envs=2)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(2, OBS))
    streams = [generator.get_state() for generator in planner.generators]
    first_plan = planner.plan(obs)
    for generator, state in zip(planner.generators, streams, strict=True):
        generator.set_state(state)  # act replans with the same draws
    actions = planner.act(obs)
    assert actions.shape == (2, ACT) and actions.dtype == np.float32
    assert np.array_equal(actions, first_plan.actions[:, 0].numpy())
    assert (np.abs(actions) <= np.array([0.5, 1.0])).all()  # clipped to the dataset's bounds
    with pytest.raises(RuntimeError, match="observe"):
        planner.act(obs)
    planner.observe(np.zeros(2), np.zeros(2, dtype=bool))
    streams = [generator.get_state() for generator in planner.generators]
    follow = planner.act(rng.normal(size=(2, OBS)))  # plan_every=2: the plan's second action
    assert all(map(torch.equal, streams, [g.get_state() for g in planner.generators]))
    assert np.array_equal(follow, first_plan.actions[:, 1].numpy())
    planner.observe(np.ones(2), np.array([True, False]))
    plan = planner.plan(rng.normal(size=(2, OBS)))
    assert plan.tokens.shape == (2, 4, 3, T)
    assert plan.observations.shape == (2, 4, 3, OBS)
    assert plan.beam_actions.shape == (2, 4, 3, ACT) and plan.actions.shape == (2, 3, ACT)
    assert plan.rewards.shape == plan.values.shape == (2, 4, 3)
    assert plan.scores.shape == (2, 4) and plan.best.tolist() == [0, 0]
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        planner.act(np.zeros((3, OBS)))


@torch.inference_mode()
def test_a_plan_of_certainly_zero_rewards_scores_its_discounted_value() -> None:
    """Sparse 0/1 rewards: where the model is sure of a zero reward, the beam score is exactly
    discount^H times the terminal value (no phantom reward from a bin's midpoint)."""
    data = np.random.default_rng(0).normal(size=(500, T))
    data[:, OBS + ACT] = (np.arange(500) % 10 == 0).astype(float)  # 90% zeros, 10% ones
    disc = Discretizer.fit(data, n_bins=N, strategy="quantile")
    zero = int(disc.encode(torch.zeros(1, 1), slice(OBS + ACT, OBS + ACT + 1)))
    model = tiny_model()
    with torch.no_grad():  # the head after the last action token predicts the reward
        model.head_weight[OBS + ACT - 1] = 0.0
        model.head_bias[OBS + ACT - 1] = -1e4
        model.head_bias[OBS + ACT - 1, zero] = 1e4
    planner = BeamPlanner(model, disc, **SMALL)
    planner.reset(2)
    plan = planner.plan(np.random.default_rng(1).normal(size=(2, OBS)))
    assert torch.equal(plan.rewards, torch.zeros_like(plan.rewards))
    H, discount = planner.config.horizon, planner.config.discount
    torch.testing.assert_close(plan.scores, discount**H * plan.values[..., -1])


@pytest.mark.parametrize("kind", ["reward", "value"])
def test_greedy_feedback_feeds_back_the_most_likely_reward_and_value_tokens(kind: str) -> None:
    """The original's k_rew=1: every planned reward (value) token is the argmax of what the
    model predicts at its position; sampled feedback draws others."""
    model, disc = tiny_model(n_bins=256, scale=2.0), tiny_discretizer(n_bins=256)
    offset = OBS + ACT + (kind == "value")

    def argmax_share(feedback: str) -> float:
        planner = BeamPlanner(model, disc, seed=3, **SMALL, **{f"{kind}_token": feedback})
        planner.reset(1)
        obs = run_steps(planner, 2)
        context = planner.context_tokens(obs)[0]
        plan = planner.plan(obs)
        sequences = torch.cat([context[None].expand(4, -1)[:, :-OBS], plan.tokens[0].flatten(1)], 1)
        with torch.inference_mode():
            logits = model(sequences)  # (beams, S, N)
        start = len(context) - OBS
        positions = [start + h * T + offset for h in range(3)]
        predicted = logits[:, [p - 1 for p in positions]].argmax(-1)  # (beams, H)
        return (predicted == sequences[:, positions]).float().mean().item()

    assert argmax_share("greedy") == 1.0
    assert argmax_share("sample") < 1.0


def test_token_feedback_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"planner\.reward_token must be one of greedy, sample"):
        PlannerConfig(reward_token="mean")


def test_greedy_planner_equals_naive_under_the_originals_value_mask() -> None:
    """The original's mask (value column hidden from itself too) plans through the PyTorch
    decode path, and still equals the full-sequence reference."""
    from dataclasses import replace

    weights = tiny_model()
    model = TrajectoryGPT(replace(weights.config, value_sees_itself=False))
    model.load_state_dict(weights.state_dict())
    disc = tiny_discretizer()
    planner = BeamPlanner(model, disc, deterministic=True, **SMALL)
    planner.reset(2)
    obs = run_steps(planner, 3)
    plan = planner.plan(obs)
    assert_same_plan(plan, naive_plan(model, disc, planner.context_tokens(obs), planner.config))


@pytest.mark.parametrize("cold", [0.0, 1.9e-170, 1e-7])
def test_a_temperature_colder_than_float32_divides_is_refused(cold) -> None:
    with pytest.raises(ValueError, match=r"planner\.temperature must be at least 1e-06"):
        PlannerConfig(temperature=cold)


def test_the_coldest_temperature_plans_finite_scores() -> None:
    planner = BeamPlanner(tiny_model(), tiny_discretizer(), temperature=MIN_TEMPERATURE, **SMALL)
    planner.reset(2)
    plan = planner.plan(run_steps(planner, 2))
    assert torch.isfinite(plan.scores).all()


@pytest.mark.parametrize("name", ["temperature", "discount", "cdf_act", "value_percentile"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_float_settings_are_refused(name, bad) -> None:
    with pytest.raises(ValueError, match=rf"planner\.{name} must be a finite number, got"):
        PlannerConfig(**{name: bad})
