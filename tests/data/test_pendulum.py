"""Embedded Pendulum datasets: controllers, batched simulation and the Minari datasets."""

from __future__ import annotations

import dataclasses
import warnings

import gymnasium as gym
import h5py
import minari
import numpy as np
import pytest

from trajectory_transformer.data import pendulum
from trajectory_transformer.data.scores import normalized_score

FAST_REFERENCE = (-1200.0, -150.0)


@pytest.fixture
def embedded_dir(tmp_path, monkeypatch):
    """A private Minari folder and cheap reference scores."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "embedded"))
    monkeypatch.setattr(pendulum, "reference_scores", lambda seed=0: FAST_REFERENCE)
    return tmp_path / "embedded"


def episodes_of(dataset: minari.MinariDataset) -> list:
    return list(dataset.iterate_episodes())


def reset_seeds(dataset_id: str) -> list[int]:
    """The reset seed stored with each episode (an HDF5 attribute minari does not hand out)."""
    path = minari.storage.get_dataset_path(dataset_id) / "data" / "main_data.hdf5"
    with h5py.File(path, "r") as file:
        return [int(file[f"episode_{i}"].attrs["seed"]) for i in range(len(file))]


def test_embedded_ids():
    assert set(pendulum.EMBEDDED_DATASETS) == {
        "pendulum/random-v0",
        "pendulum/medium-v0",
        "pendulum/expert-v0",
        "pendulum/medium-replay-v0",
        "pendulum/medium-expert-v0",
    }
    assert all(pendulum.is_embedded(d) for d in pendulum.EMBEDDED_DATASETS)
    assert not pendulum.is_embedded("D4RL/door/human-v2")
    assert not pendulum.is_embedded("pendulum/medium-v1")


def test_unknown_id_names_known_ids(embedded_dir):
    with pytest.raises(ValueError, match="unknown embedded dataset") as error:
        pendulum.build_embedded_dataset("pendulum/great-v0")
    for dataset_id in pendulum.EMBEDDED_DATASETS:
        assert dataset_id in str(error.value)


def test_builds_and_loads(embedded_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the builder must not leak minari's metadata warnings
        built = pendulum.build_embedded_dataset("pendulum/medium-v0", episodes=4, seed=3)
    assert (embedded_dir / "pendulum" / "medium-v0" / "data").is_dir()
    dataset = minari.load_dataset("pendulum/medium-v0")
    assert dataset.total_episodes == built.total_episodes == 4
    assert dataset.total_steps == 4 * 200

    metadata = dataset.storage.metadata
    assert (metadata["ref_min_score"], metadata["ref_max_score"]) == FAST_REFERENCE
    assert metadata["author"] == {"trajectory-transformer"}
    assert "author_email" not in metadata and "code_permalink" not in metadata
    assert "Mean return" in metadata["description"]
    assert "normalised score" in metadata["description"]
    assert metadata["algorithm_name"]
    assert dataset.spec.env_spec.id == "Pendulum-v1"
    assert dataset.spec.env_spec.max_episode_steps == 200
    assert gym.envs.registration.EnvSpec.from_json(metadata["eval_env_spec"]).id == "Pendulum-v1"

    assert len(set(reset_seeds("pendulum/medium-v0"))) == 4
    for episode in episodes_of(dataset):
        assert episode.observations.shape == (201, 3)
        assert episode.observations.dtype == np.float32
        assert episode.actions.shape == (200, 1)
        assert np.abs(episode.actions).max() <= 2.0
        assert episode.rewards.shape == (200,)
        assert not episode.terminations.any()  # Pendulum never terminates ...
        assert episode.truncations[-1] and not episode.truncations[:-1].any()  # ... only times out


def test_every_dataset_builds_with_distinct_seeds(embedded_dir):
    sizes = {}
    all_seeds = {}
    for dataset_id in pendulum.EMBEDDED_DATASETS:
        dataset = pendulum.build_embedded_dataset(dataset_id, episodes=3)
        sizes[dataset_id] = dataset.total_episodes
        seeds = reset_seeds(dataset_id)
        assert len(set(seeds)) == len(seeds)
        all_seeds[dataset_id] = set(seeds)
    assert sizes["pendulum/medium-expert-v0"] == 6
    assert all(n == 3 for d, n in sizes.items() if d != "pendulum/medium-expert-v0")
    singles = [s for d, s in all_seeds.items() if d != "pendulum/medium-expert-v0"]
    assert len(set.union(*singles)) == sum(len(s) for s in singles)  # disjoint across datasets


def test_medium_expert_is_medium_then_expert(embedded_dir):
    medium = episodes_of(pendulum.build_embedded_dataset("pendulum/medium-v0", episodes=3))
    expert = episodes_of(pendulum.build_embedded_dataset("pendulum/expert-v0", episodes=3))
    mixed = episodes_of(pendulum.build_embedded_dataset("pendulum/medium-expert-v0", episodes=3))
    assert len(mixed) == 6
    for got, want in zip(mixed, medium + expert, strict=True):
        np.testing.assert_array_equal(got.observations, want.observations)
        np.testing.assert_array_equal(got.actions, want.actions)
        np.testing.assert_array_equal(got.rewards, want.rewards)


def test_deterministic_given_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(pendulum, "reference_scores", lambda seed=0: FAST_REFERENCE)

    def build(folder: str, seed: int) -> list:
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / folder))
        pendulum._kind_rollout.cache_clear()  # really simulate again
        dataset = pendulum.build_embedded_dataset(
            "pendulum/medium-replay-v0", episodes=4, seed=seed
        )
        return episodes_of(dataset)

    first, again, other = build("a", 0), build("b", 0), build("c", 1)
    for x, y in zip(first, again, strict=True):
        np.testing.assert_array_equal(x.observations, y.observations)
        np.testing.assert_array_equal(x.actions, y.actions)
        np.testing.assert_array_equal(x.rewards, y.rewards)
    assert not np.array_equal(first[0].observations, other[0].observations)


def test_existing_dataset_is_loaded_unless_overwrite(embedded_dir):
    assert pendulum.build_embedded_dataset("pendulum/random-v0", episodes=2).total_episodes == 2
    kept = pendulum.build_embedded_dataset("pendulum/random-v0", episodes=3)
    assert kept.total_episodes == 2
    rebuilt = pendulum.build_embedded_dataset("pendulum/random-v0", episodes=3, overwrite=True)
    assert rebuilt.total_episodes == 3
    assert minari.load_dataset("pendulum/random-v0").total_episodes == 3


def test_failed_build_leaves_nothing(embedded_dir, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(minari, "create_dataset_from_buffers", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        pendulum.build_embedded_dataset("pendulum/expert-v0", episodes=2)
    assert not (embedded_dir / "pendulum" / "expert-v0").exists()


def test_rollout_records_what_gymnasium_does():
    """Each stored episode replays in a plain Pendulum-v1: the observation, action and reward
    at every index belong together (no off-by-one between the vector env and the buffers)."""
    seeds = np.arange(100, 104)
    result = pendulum.rollout(pendulum.EpsilonRandomExpert(0.5), seeds, np.random.default_rng(0))
    assert result.observations.shape == (4, 201, 3) and result.actions.shape == (4, 200, 1)
    env = gym.make("Pendulum-v1")
    for i, seed in enumerate(seeds):
        obs, _ = env.reset(seed=int(seed))
        observations, rewards = [obs], []
        for action in result.actions[i]:
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            rewards.append(reward)
        assert truncated and not terminated
        # Same code on both sides; the tolerance is float32's, never bit-equality.
        np.testing.assert_allclose(result.observations[i], observations, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(result.rewards[i], rewards, rtol=1e-6, atol=1e-6)
    assert not result.terminations.any()
    assert result.truncations[:, -1].all() and not result.truncations[:, :-1].any()


def test_rollout_refuses_episodes_that_do_not_run_to_the_time_limit(monkeypatch):
    longer = dataclasses.replace(gym.spec("Pendulum-v1"), max_episode_steps=250)
    monkeypatch.setattr(pendulum.gym, "spec", lambda env_id: longer)
    with pytest.raises(RuntimeError, match="expected to run 250 steps"):
        pendulum.rollout(pendulum.EpsilonRandomExpert(0.0), np.arange(2), np.random.default_rng(0))


def test_expert_beats_medium_beats_random():
    seeds = np.arange(1000, 1012)
    returns = {
        name: pendulum.rollout(
            pendulum.EpsilonRandomExpert(epsilon), seeds, np.random.default_rng(0)
        ).returns.mean()
        for name, epsilon in [("expert", 0.0), ("medium", pendulum.MEDIUM_EPSILON), ("random", 1.0)]
    }
    assert returns["expert"] > returns["medium"] + 200 > returns["random"] + 200 + 100
    assert returns["expert"] > -250


def test_expert_action_bounds_and_balance():
    angles = np.linspace(-np.pi, np.pi, 101)
    velocities = np.linspace(-8, 8, 101)
    a, v = np.meshgrid(angles, velocities)
    obs = np.stack([np.cos(a).ravel(), np.sin(a).ravel(), v.ravel()], axis=1)
    actions = pendulum.expert_action(obs)
    assert actions.shape == (len(obs), 1) and actions.dtype == np.float32
    assert np.abs(actions).max() <= 2.0
    # Started close to upright, the expert holds it there at almost no cost.
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=0, options={"x_init": 0.2, "y_init": 0.5})
    total = 0.0
    for _ in range(200):
        obs, reward, *_ = env.step(pendulum.expert_action(obs[None])[0])
        total += reward
    assert total > -5.0
    assert obs[0] > 0.999


def test_reference_scores_small():
    low, high = pendulum.reference_scores(0, episodes=5)
    assert low < -700 < -300 < high
    assert pendulum.reference_scores(0, episodes=5) == (low, high)
    score = normalized_score(np.array([low, high]), low, high)
    np.testing.assert_allclose(score, [0.0, 100.0])
