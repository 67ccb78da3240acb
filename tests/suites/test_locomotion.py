"""The locomotion suites' own parts (Hopper, Walker2d): shipped SAC actors and how they load,
falls kept apart from time limits with only a fall penalised, and the evaluation loop on a
terminating environment (what every suite shares is in test_suites.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from trajectory_transformer.data.episodes import joint_transitions
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.evaluation import evaluate
from trajectory_transformer.suites import collect, locomotion
from trajectory_transformer.suites.actors import GaussianActor
from trajectory_transformer.suites.locomotion import HOPPER as hopper
from trajectory_transformer.suites.locomotion import WALKER2D as walker2d

TASKS = [hopper, walker2d]
OBS_DIMS = {"hopper": 11, "walker2d": 17}


def test_actors_load_as_plain_weights_and_act_in_the_box(tmp_path):
    GaussianActor(11, 3, hidden=16).save(tmp_path / "medium.pt", step=1, mean_return=1)
    payload = torch.load(tmp_path / "medium.pt", weights_only=True)
    assert set(payload) == {"state_dict", "shape", "metadata"}
    actor = GaussianActor.load(tmp_path / "medium.pt")
    assert actor.metadata == {"step": 1, "mean_return": 1}
    obs = np.random.default_rng(0).normal(size=(7, 11))
    rng = np.random.default_rng(1)
    for action in (actor.act(obs), actor.act(obs, 0.5, rng)):
        assert action.shape == (7, 3) and np.all(np.abs(action) <= 1.0)
    with pytest.raises(ValueError, match="Generator"):
        actor.act(obs, 0.5)


def test_replay_stages_are_the_snapshots_in_order_then_the_medium_actor(tmp_path, monkeypatch):
    for name in ("replay_1", "medium", "replay_0", "expert"):
        (tmp_path / f"{name}.pt").touch()
    monkeypatch.setattr(hopper, "policy_dir", tmp_path)
    assert hopper.replay_actors() == ["replay_0", "replay_1", "medium"]


@pytest.mark.parametrize("task", TASKS, ids=lambda task: task.task)
def test_the_shipped_actors_are_small_plain_weights_ordered_by_their_returns(task):
    shipped = locomotion.POLICIES / task.task
    names = ["expert", "medium", *sorted(p.stem for p in shipped.glob("replay_*.pt"))]
    assert len(names) >= 5 and (shipped / "README.md").is_file()
    obs_dim, act_dim = OBS_DIMS[task.task], task.action_dim
    obs = np.random.default_rng(0).normal(size=(5, obs_dim))
    returns = {}
    for name in names:
        path = shipped / f"{name}.pt"
        assert path.stat().st_size < 200_000
        actor = GaussianActor.load(path)  # weights_only=True
        assert (actor.obs_dim, actor.act_dim) == (obs_dim, act_dim)
        for action in (actor.act(obs), actor.act(obs, 0.1, np.random.default_rng(1))):
            assert action.shape == (5, act_dim) and np.all(np.abs(action) <= 1.0)
        returns[name] = actor.metadata["mean_return"]
    replay = [returns[name] for name in names[2:]]
    assert returns["expert"] == max(returns.values())
    assert max(replay) < returns["medium"] < returns["expert"] / 2


def test_a_missing_actor_says_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.setattr(walker2d, "policy_dir", tmp_path)
    walker2d.clear_caches()
    try:
        with pytest.raises(FileNotFoundError, match=r"train_behaviour_policy\.py --env Walker2d"):
            walker2d.actor("expert")
    finally:
        walker2d.clear_caches()


@pytest.mark.parametrize("task", TASKS, ids=lambda task: task.task)
def test_termination_is_penalised_and_truncation_is_not(task):
    rng = np.random.default_rng(0)
    fell = collect.rollout(task.env_id, task.uniform_random, [0], rng)  # random falls fast
    expert = task.noisy("expert", 0.0)  # the shipped expert stands for 5 steps
    cut = collect.rollout(task.env_id, expert, [1], rng, max_episode_steps=5)
    assert fell.terminations[0][-1] and not fell.truncations[0][-1]
    assert cut.truncations[0][-1] and not cut.terminations[0][-1]
    for run, penalty in ((fell, -100.0), (cut, 0.0)):
        episodes = _as_episodes(run, task.env_id)
        rows = joint_transitions(episodes, discount=0.99, terminal_penalty=-100.0)
        rewards = run.rewards[0].copy()
        rewards[-1] += penalty
        # The value token: the discounted return after the step, penalty included.
        after = [
            rewards[t + 1 :] @ 0.99 ** np.arange(len(rewards) - t - 1) for t in range(len(rewards))
        ]
        values = np.array(after)
        np.testing.assert_allclose(rows[:, -2], rewards, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(rows[:, -1], values, rtol=1e-5, atol=1e-3)


def _as_episodes(run: collect.Rollout, env_id: str):
    """The rollout as the trainer reads it, through a Minari dataset."""
    collect.write("test/run-v0", run.buffers(), env_id, "test", (0.0, 1.0), 1, "test", "test")
    episodes, _ = load_episodes("test/run-v0")
    collect.existing("test/run-v0", overwrite=True)
    return episodes


class ZeroAgent:
    """Plays zero torques: the hopper falls after a seed-dependent number of steps."""

    def reset(self, num_envs, seed=None):
        pass

    def act(self, observations, active=None):
        return np.zeros((len(observations), 3), np.float32)

    def observe(self, rewards, dones):
        pass


def test_a_vector_rollout_scores_every_terminating_episode_once():
    env = gym.vector.SyncVectorEnv([lambda: gym.make("Hopper-v5")] * 3)
    result = evaluate(ZeroAgent(), env, episodes=7, seed=40, progress=False)
    env.close()
    assert sorted(result.seeds) == list(range(40, 47))
    for seed, ret, length in zip(result.seeds, result.returns, result.lengths, strict=True):
        single = gym.make("Hopper-v5")
        single.reset(seed=seed)
        total, steps, done = 0.0, 0, False
        while not done:
            _, reward, terminated, truncated, _ = single.step(np.zeros(3, np.float32))
            total, steps, done = total + reward, steps + 1, terminated or truncated
        assert terminated and steps == length
        assert ret == pytest.approx(total, rel=1e-9)
    assert len(set(result.lengths)) > 1  # envs of one wave ended at different steps
    assert result.env_steps == sum(result.lengths)
