"""The embedded Hopper suite: shipped SAC actors, terminations kept apart from truncations,
reference scores; and the method's episode ends on a real terminating environment."""

from __future__ import annotations

import itertools
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from trajectory_transformer.data import embedded, hopper
from trajectory_transformer.data.behaviour import GaussianActor
from trajectory_transformer.data.episodes import joint_transitions
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.evaluation import evaluate

SHIPPED = Path(hopper.__file__).parent / "policies" / "hopper"


@pytest.fixture(autouse=True)
def actors(tmp_path, monkeypatch):
    """Seeded, untrained actors in place of the shipped ones: the builders' mechanics, fast
    (untrained actors fall within a few dozen steps)."""
    for i, name in enumerate(["expert", "medium", "replay_0", "replay_1"]):
        torch.manual_seed(i)
        GaussianActor(11, 3, hidden=16).save(tmp_path / f"{name}.pt", step=i, mean_return=i)
    monkeypatch.setattr(hopper, "POLICY_DIR", tmp_path)
    hopper.actor.cache_clear()
    hopper.reference_scores.cache_clear()
    yield
    hopper.actor.cache_clear()
    hopper.reference_scores.cache_clear()


def test_actors_load_as_plain_weights_and_act_in_the_box(tmp_path):
    payload = torch.load(tmp_path / "medium.pt", weights_only=True)
    assert set(payload) == {"state_dict", "shape", "metadata"}
    actor = hopper.actor("medium")
    assert actor.metadata == {"step": 1, "mean_return": 1}
    assert hopper.replay_actors() == ["replay_0", "replay_1", "medium"]
    obs = np.random.default_rng(0).normal(size=(7, 11))
    rng = np.random.default_rng(1)
    for action in (actor.act(obs), actor.act(obs, 0.5, rng)):
        assert action.shape == (7, 3) and np.all(np.abs(action) <= 1.0)
    with pytest.raises(ValueError, match="Generator"):
        actor.act(obs, 0.5)


def test_the_shipped_actors_are_small_plain_weights_ordered_by_their_returns():
    names = ["expert", "medium", *sorted(p.stem for p in SHIPPED.glob("replay_*.pt"))]
    assert len(names) >= 5 and (SHIPPED / "README.md").is_file()
    obs = np.random.default_rng(0).normal(size=(5, 11))
    returns = {}
    for name in names:
        path = SHIPPED / f"{name}.pt"
        assert path.stat().st_size < 100_000
        actor = GaussianActor.load(path)  # weights_only=True
        assert (actor.obs_dim, actor.act_dim) == (11, 3)
        for action in (actor.act(obs), actor.act(obs, 0.1, np.random.default_rng(1))):
            assert action.shape == (5, 3) and np.all(np.abs(action) <= 1.0)
        returns[name] = actor.metadata["mean_return"]
    replay = [returns[name] for name in names[2:]]
    assert returns["expert"] == max(returns.values())
    assert max(replay) < returns["medium"] < returns["expert"] / 2


def test_a_missing_actor_says_how_to_make_it(tmp_path):
    (tmp_path / "expert.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"train_behaviour_policy\.py"):
        hopper.actor("expert")


def test_a_small_build_is_a_minari_dataset_with_falls_and_reference_scores():
    assert all(embedded.family(f"hopper/{kind}-v0") is hopper for kind in hopper.NOISE)
    dataset = hopper.build_embedded_dataset("hopper/medium-v0", episodes=4, reference_episodes=2)
    assert dataset.total_episodes == 4
    metadata = dataset.storage.metadata
    assert metadata["ref_min_score"] < metadata["ref_max_score"]
    assert "SAC" in metadata["description"] and "noise" in metadata["description"]
    for episode in dataset.iterate_episodes():
        ends = episode.terminations | episode.truncations
        assert not (episode.terminations & episode.truncations).any()
        assert ends[-1] and not ends[:-1].any()  # one end, at the last step
        if len(episode.rewards) < 1000:
            assert episode.terminations[-1]  # shorter than the limit: it fell
    # Replayed in a fresh env from its reset seed, each episode is what gymnasium returns.
    seeds = [m["seed"] for m in dataset.storage.get_episode_metadata(range(4))]
    assert len(set(seeds)) == 4
    for seed, episode in zip(seeds, dataset.iterate_episodes(), strict=True):
        env = gym.make("Hopper-v5")
        obs, _ = env.reset(seed=int(seed))
        steps = [env.step(action) for action in episode.actions]
        env.close()
        observations = np.array([obs] + [step[0] for step in steps])
        np.testing.assert_allclose(episode.observations, observations, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(episode.rewards, [step[1] for step in steps], rtol=1e-6)
        np.testing.assert_array_equal(episode.terminations, [step[2] for step in steps])
        np.testing.assert_array_equal(episode.truncations, [step[3] for step in steps])


def test_medium_expert_is_the_medium_then_the_expert_episodes():
    medium = hopper.build_embedded_dataset("hopper/medium-v0", episodes=2, reference_episodes=2)
    expert = hopper.build_embedded_dataset("hopper/expert-v0", episodes=2, reference_episodes=2)
    both = hopper.build_embedded_dataset(
        "hopper/medium-expert-v0", episodes=2, reference_episodes=2
    )
    together = list(medium.iterate_episodes()) + list(expert.iterate_episodes())
    assert both.total_episodes == 4
    for a, b in zip(both.iterate_episodes(), together, strict=True):
        np.testing.assert_allclose(a.observations, b.observations, rtol=1e-6, atol=1e-8)
        np.testing.assert_array_equal(a.terminations, b.terminations)


def test_an_env_that_ends_starts_the_next_seed_and_each_episode_is_its_own():
    def policy(obs, rng):  # zero torques: deterministic, and falls at seed-dependent steps
        return np.zeros((len(obs), 3))

    rng = np.random.default_rng(0)
    together = hopper.rollout(policy, range(7), rng, num_envs=3)
    assert together.seeds == list(range(7))
    assert len({len(r) for r in together.rewards}) > 1  # the envs restarted at different steps
    for i, seed in enumerate(together.seeds):
        alone = hopper.rollout(policy, [seed], rng, num_envs=1)
        np.testing.assert_allclose(
            together.observations[i], alone.observations[0], rtol=1e-6, atol=1e-8
        )
        np.testing.assert_array_equal(together.terminations[i], alone.terminations[0])
        np.testing.assert_array_equal(together.truncations[i], alone.truncations[0])


def test_a_transition_budget_keeps_the_shortest_prefix_of_seeds_that_reaches_it():
    rng = np.random.default_rng(0)
    run = hopper.rollout(hopper.uniform_random, itertools.count(10), rng, transitions=150)
    lengths = [len(r) for r in run.rewards]
    assert run.seeds == list(range(10, 10 + len(lengths)))
    assert sum(lengths) >= 150 > sum(lengths[:-1])


def test_termination_is_penalised_and_truncation_is_not():
    rng = np.random.default_rng(0)
    fell = hopper.rollout(hopper.uniform_random, [0], rng)  # random actions fall fast
    cut = hopper.rollout(hopper.noisy("expert", 0.0), [1], rng, max_episode_steps=5)
    assert fell.terminations[0][-1] and not fell.truncations[0][-1]
    assert cut.truncations[0][-1] and not cut.terminations[0][-1]
    for run, penalty in ((fell, -100.0), (cut, 0.0)):
        episodes = _as_episodes(run)
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


def _as_episodes(run: hopper.Episodes):
    """The rollout as the trainer reads it, through a Minari dataset."""
    from trajectory_transformer.data import local_datasets

    local_datasets.write(
        "test/hopper-run-v0", run.buffers(), hopper.ENV_ID, "test", (0.0, 1.0), 1, "test", "test"
    )
    episodes, _ = load_episodes("test/hopper-run-v0")
    local_datasets.existing("test/hopper-run-v0", overwrite=True)
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
