"""The IQL critic: its loss, what it learns on MDPs solved by hand, bootstrapping at
truncations only, checkpoints that resume to the step, and its command line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import create_dataset, run_module

from trajectory_transformer.checkpoint import CheckpointError, save_atomic
from trajectory_transformer.critic.model import (
    build_critic_payload,
    check_critic_matches,
    critic_from_payload,
    load_critic,
    read_critic_payload,
)
from trajectory_transformer.critic.training import (
    CriticConfig,
    CriticTrainer,
    critic_transitions,
    expectile_loss,
    new_critic,
    transitions_of,
)
from trajectory_transformer.data.episodes import Episodes
from trajectory_transformer.data.minari_source import load_episodes

DISCOUNT = 0.9
FAST = dict(  # tiny networks and fast targets: a few seconds on a CPU
    hidden_dim=32,
    batch_size=64,
    learning_rate=5e-3,
    target_update_rate=0.1,
    discount=DISCOUNT,
    log_every=10_000,
    checkpoint_every=10_000,
    terminal_penalty=0.0,  # the hand-solved MDPs below count raw rewards
)


def episodes_of(steps: list[list[tuple[float, float, float]]], finals, terminated) -> Episodes:
    """Episodes of 1-D observations and actions from (obs, action, reward) steps."""
    rows = [step for episode in steps for step in episode]
    lengths = np.array([len(episode) for episode in steps])
    ends = np.cumsum(lengths) - 1
    end_flags = np.zeros(len(rows), dtype=bool)
    end_flags[ends] = True
    terminated = np.repeat(np.asarray(terminated, dtype=bool), lengths) & end_flags
    return Episodes(
        observations=np.array([[o] for o, _, _ in rows], dtype=np.float32),
        actions=np.array([[a] for _, a, _ in rows], dtype=np.float32),
        rewards=np.array([r for _, _, r in rows], dtype=np.float32),
        terminated=terminated,
        truncated=end_flags & ~terminated,
        lengths=lengths,
        final_observations=np.array([[f] for f in finals], dtype=np.float32),
    )


def train(episodes: Episodes, steps: int, seed: int = 0, **settings):
    torch.manual_seed(seed)
    cfg = CriticConfig(steps=steps, **(FAST | settings))
    critic, policy = new_critic(episodes, cfg, [-1.0], [1.0])
    transitions = critic_transitions(critic, episodes, "cpu")
    trainer = CriticTrainer(
        critic, policy, transitions, cfg, save=lambda state: None, seed=seed, progress=False
    )
    trainer.train()
    return critic, trainer


def test_expectile_loss_weighs_the_two_sides_by_tau_and_one_minus_tau() -> None:
    # u = 2 weighs 0.7 * 4 = 2.8; u = -1 weighs 0.3 * 1 = 0.3; u = 0 nothing; mean of three.
    loss = expectile_loss(torch.tensor([2.0, -1.0, 0.0]), 0.7)
    assert loss.item() == pytest.approx((2.8 + 0.3 + 0.0) / 3)
    assert expectile_loss(torch.tensor([-3.0]), 0.5).item() == pytest.approx(0.5 * 9)


def chain_episodes(n: int, seed: int = 0) -> Episodes:
    """States 0..n-1 on a line; action +1 steps right, -1 left (staying at 0); stepping right
    from n-1 reaches the goal: reward 1, termination. Uniformly random actions, episodes cut
    (truncated) after 4n steps."""
    rng = np.random.default_rng(seed)
    steps, finals, terminated = [], [], []
    while sum(map(len, steps)) < 3000:
        state, episode = 0, []
        for _ in range(4 * n):
            action = float(rng.choice([-1.0, 1.0]))
            following = max(state + int(action), 0)
            reward = 1.0 if following == n else 0.0
            episode.append((float(state), action, reward))
            state = following
            if state == n:
                break
        steps.append(episode)
        finals.append(float(state))
        terminated.append(state == n)
    return episodes_of(steps, finals, terminated)


def test_on_a_chain_the_learned_q_is_near_the_optimal_q() -> None:
    n = 4
    critic, _ = train(chain_episodes(n), steps=600, expectile=0.99)
    # Optimal: right from k reaches the goal in n - k steps, left costs two more.
    states = torch.arange(n, dtype=torch.float32)[:, None]
    optimal_right = DISCOUNT ** (n - 1 - states[:, 0])
    optimal_left = DISCOUNT ** (n - 1 - (states[:, 0] - 1).clamp(min=0)) * DISCOUNT
    with torch.no_grad():
        right = critic.q(states, torch.ones(n, 1))
        left = critic.q(states, -torch.ones(n, 1))
        value = critic.value(states)
    torch.testing.assert_close(right, optimal_right, atol=0.05, rtol=0)
    torch.testing.assert_close(left, optimal_left, atol=0.05, rtol=0)
    torch.testing.assert_close(value, optimal_right, atol=0.05, rtol=0)  # V -> max_a Q


def test_a_termination_carries_the_models_terminal_penalty() -> None:
    """The critic learns the model's rewards: on the chain, stepping right from the last state
    terminates, earning 1 plus the penalty, and the values before it see the penalty too."""
    n, penalty = 4, -10.0
    episodes = chain_episodes(n)
    cfg = CriticConfig(steps=1, **(FAST | {"terminal_penalty": penalty}))
    critic, _ = new_critic(episodes, cfg, [-1.0], [1.0])
    assert critic.terminal_penalty == penalty
    transitions = transitions_of(episodes, 1.0, 0.0, "cpu", terminal_penalty=penalty)
    ended = transitions.terminated.bool()
    assert (transitions.rewards[ended] == 1.0 + penalty).all()
    assert (transitions.rewards[~ended] == 0.0).all()
    trained, _ = train(episodes, steps=600, expectile=0.99, terminal_penalty=penalty)
    with torch.no_grad():
        q = trained.q(torch.tensor([[n - 1.0]]), torch.ones(1, 1))
    assert q.item() == pytest.approx(1.0 + penalty, abs=0.5)


@pytest.mark.parametrize("ends", ["terminated", "truncated"])
def test_a_truncated_step_bootstraps_from_the_final_observation_a_terminated_one_does_not(
    ends: str,
) -> None:
    # From 0 the only step leads to 1 with reward 0, and the episode ends there. From 1 the
    # only step earns 1 and terminates. Truncated at 1: Q(0) = discount * V(1) = discount.
    # Terminated at 1: nothing follows, Q(0) = 0.
    first = [[(0.0, 1.0, 0.0)]]
    second = [[(1.0, 1.0, 1.0)]]
    episodes = episodes_of(
        first * 50 + second * 50, [1.0] * 100, [ends == "terminated"] * 50 + [True] * 50
    )
    transitions = transitions_of(episodes, 1.0, 0.0, "cpu", terminal_penalty=0.0)
    assert transitions.next_observations[0].item() == 1.0  # the final observation
    assert transitions.terminated[0].item() == (ends == "terminated")
    critic, _ = train(episodes, steps=300)
    with torch.no_grad():
        q = critic.q(torch.tensor([[0.0], [1.0]]), torch.ones(2, 1))
    expected = 0.0 if ends == "terminated" else DISCOUNT
    assert q[0].item() == pytest.approx(expected, abs=0.05)
    assert q[1].item() == pytest.approx(1.0, abs=0.05)


def test_next_observations_end_each_episode_with_its_final_observation() -> None:
    episodes = episodes_of([[(0, 0, 0), (1, 0, 0)], [(5, 0, 0)]], [2.0, 6.0], [False, True])
    np.testing.assert_array_equal(episodes.next_observations()[:, 0], [1.0, 2.0, 6.0])
    np.testing.assert_array_equal(episodes.select(np.array([1])).next_observations(), [[6.0]])


def test_minari_episodes_keep_their_final_observations(tiny_dataset) -> None:
    episodes, _ = load_episodes("test/tiny-v0")
    first = next(tiny_dataset.iterate_episodes())
    n = len(first.rewards)
    np.testing.assert_array_equal(episodes.final_observations[0], first.observations[n])
    np.testing.assert_array_equal(episodes.next_observations()[:n], first.observations[1:])


def test_a_resumed_critic_continues_exactly_where_it_was_saved(tmp_path, tiny_dataset) -> None:
    episodes, info = load_episodes("test/tiny-v0")
    cfg = CriticConfig(steps=12, **(FAST | {"hidden_dim": 8, "batch_size": 8}))

    def fresh():
        torch.manual_seed(0)
        critic, policy = new_critic(episodes, cfg, info.action_low, info.action_high)
        transitions = critic_transitions(critic, episodes, "cpu")
        path = tmp_path / "critic.pt"

        def save(state):
            payload = build_critic_payload(critic, policy, info, {"critic": {}}, state)
            return save_atomic(payload, path)

        trainer = CriticTrainer(critic, policy, transitions, cfg, save, progress=False)
        return critic, trainer, transitions, path

    straight, trainer, _, _ = fresh()
    trainer.train()

    _, halfway, transitions, path = fresh()
    for _ in range(5):  # five steps, then a checkpoint, as a Ctrl-C leaves it
        halfway.train_step(torch.randint(len(transitions), (8,), generator=halfway.generator))
    halfway._save()
    payload = read_critic_payload(path)
    critic, policy, trained_on = critic_from_payload(payload)
    assert trained_on == info
    resumed = CriticTrainer(critic, policy, transitions, cfg, halfway.save, progress=False)
    resumed.load_state(payload["training"])
    assert resumed.step == 5
    resumed.train()
    for name, tensor in straight.state_dict().items():
        torch.testing.assert_close(critic.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_a_critic_of_another_dataset_is_refused_in_one_line(tmp_path, tiny_dataset) -> None:
    create_dataset("test/other-v0", obs_dim=4)
    _, tiny = load_episodes("test/tiny-v0")
    _, other = load_episodes("test/other-v0")
    check_critic_matches(tiny, tiny)
    with pytest.raises(CheckpointError) as refused:
        check_critic_matches(other, tiny, "critic.pt")
    message = str(refused.value)
    assert "\n" not in message
    assert "'test/other-v0'" in message and "tt-train-critic dataset.id=test/tiny-v0" in message


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"half a critic", r"is not a critic checkpoint, or is damaged \(torch cannot read it"),
        (None, r"is not a critic checkpoint \(a model checkpoint of tt-train"),
    ],
)
def test_a_damaged_or_foreign_file_is_refused_as_a_model_checkpoint_is(tmp_path, content, message):
    path = tmp_path / "critic.pt"
    if content is None:
        save_atomic({"format_version": 2}, path)  # a model's
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        read_critic_payload(path)
    with pytest.raises(CheckpointError, match="no critic at"):
        read_critic_payload(tmp_path / "missing.pt")


CLI = [
    "dataset.id=test/tiny-v0",
    "critic.steps=6",
    "critic.hidden_dim=8",
    "critic.batch_size=8",
    "critic.checkpoint_every=3",
    "critic.log_every=2",
    "device=cpu",
]


def test_the_command_line_trains_resumes_and_the_iql_policy_plays(tmp_path, tiny_dataset):
    run = tmp_path / "critic"
    done = run_module("trajectory_transformer.cli.train_critic", *CLI, f"hydra.run.dir={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained the critic 6 steps" in done.stdout
    checkpoint = load_critic(run / "critic.pt")
    assert checkpoint.dataset.dataset_id == "test/tiny-v0" and checkpoint.training["step"] == 6
    assert (run / "metrics.jsonl").read_text().count("train/q_loss") == 3

    # A critic from before hindsight goals has no critic.relabel_goals: it trained without.
    payload = read_critic_payload(run / "critic.pt")
    del payload["config"]["critic"]["relabel_goals"]
    save_atomic(payload, run / "critic.pt")
    again = run_module(
        "trajectory_transformer.cli.train_critic",
        *CLI,
        f"resume={run / 'critic.pt'}",
        f"hydra.run.dir={tmp_path / 'again'}",
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in again.stdout and "at step 6/6" in again.stdout

    changed = run_module(
        "trajectory_transformer.cli.train_critic",
        *CLI[:-1],
        "critic.expectile=0.9",
        f"resume={run / 'critic.pt'}",
        f"hydra.run.dir={tmp_path / 'changed'}",
    )
    assert changed.returncode == 2
    assert "critic.expectile: checkpoint 0.7, now 0.9" in changed.stderr

    played = run_module(
        "trajectory_transformer.cli.evaluate",
        f"checkpoint={run / 'critic.pt'}",
        "planner=iql",
        "eval.episodes=2",
        "eval.max_episode_steps=5",
        "eval.progress=false",
        "device=cpu",
        f"hydra.run.dir={tmp_path / 'eval'}",
    )
    assert played.returncode == 0, played.stderr[-2000:]
    assert "planner iql | 2 episodes" in played.stdout

    as_model = run_module(
        "trajectory_transformer.cli.evaluate",
        f"checkpoint={run / 'critic.pt'}",
        "device=cpu",
        f"hydra.run.dir={tmp_path / 'eval2'}",
    )
    assert as_model.returncode == 2
    assert "is a critic checkpoint (tt-train-critic)" in as_model.stderr


def test_a_non_finite_step_stops_the_critic_before_it_reaches_the_weights() -> None:
    from trajectory_transformer.training.trainer import NonFiniteLossError

    episodes = chain_episodes(4)
    cfg = CriticConfig(steps=5, **FAST)
    critic, policy = new_critic(episodes, cfg, [-1.0], [1.0])
    transitions = critic_transitions(critic, episodes, "cpu")
    transitions.rewards[:] = float("inf")  # past the loader's check, as a bug upstream would
    trainer = CriticTrainer(critic, policy, transitions, cfg, save=lambda state: None)
    before = [p.detach().clone() for p in [*critic.parameters(), *policy.parameters()]]
    with pytest.raises(NonFiniteLossError, match=r"critic's losses are not finite.*step 1"):
        trainer.train_step(torch.arange(8))
    after = [*critic.parameters(), *policy.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert trainer.step == 0
