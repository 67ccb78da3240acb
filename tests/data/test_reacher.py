"""Embedded Reacher dataset: the scripted controller, the dataset, and the shared registry."""

from __future__ import annotations

import functools
import warnings

import gymnasium as gym
import minari
import numpy as np
import pytest

from trajectory_transformer.data import embedded, hopper, pendulum, reacher
from trajectory_transformer.data.minari_source import DatasetError, load_episodes, load_minari

FAST_REFERENCE = (-43.0, -3.6)
PENDULUM_REFERENCE = (-1200.0, -150.0)


@pytest.fixture
def cheap_references(monkeypatch):
    """Reference scores that cost nothing to compute, for both families."""
    monkeypatch.setattr(reacher, "reference_scores", lambda seed=0: FAST_REFERENCE)
    monkeypatch.setattr(pendulum, "reference_scores", lambda seed=0: PENDULUM_REFERENCE)


def mean_return(policy, seeds) -> float:
    return float(reacher.rollout(policy, seeds, np.random.default_rng(0)).returns.mean())


def test_embedded_ids():
    assert set(reacher.EMBEDDED_DATASETS) == {"reacher/medium-v0"}
    assert reacher.is_embedded("reacher/medium-v0")
    assert not reacher.is_embedded("pendulum/medium-v0")
    assert not reacher.is_embedded("mujoco/reacher/medium-v0")


def test_registry_holds_every_family():
    assert set(embedded.EMBEDDED_DATASETS) == set(pendulum.EMBEDDED_DATASETS) | {
        "reacher/medium-v0"
    } | set(hopper.EMBEDDED_DATASETS)
    assert embedded.family("hopper/medium-v0") is hopper
    assert embedded.family("reacher/medium-v0") is reacher
    assert embedded.family("pendulum/expert-v0") is pendulum
    assert all(embedded.is_embedded(d) for d in embedded.EMBEDDED_DATASETS)
    assert not embedded.is_embedded("mujoco/hopper/medium-v0")


def test_registry_builds_both_families(minari_dir, cheap_references):
    built = {
        dataset_id: embedded.build_embedded_dataset(dataset_id, episodes=2)
        for dataset_id in ("pendulum/expert-v0", "reacher/medium-v0")
    }
    assert built["pendulum/expert-v0"].spec.env_spec.id == "Pendulum-v1"
    assert built["pendulum/expert-v0"].total_steps == 2 * 200
    assert built["reacher/medium-v0"].spec.env_spec.id == "Reacher-v5"
    assert built["reacher/medium-v0"].total_steps == 2 * 50
    assert {"pendulum/expert-v0", "reacher/medium-v0"} <= set(minari.list_local_datasets())


def test_registry_keeps_each_familys_default_size(monkeypatch):
    calls = []
    monkeypatch.setattr(reacher, "build_embedded_dataset", lambda *a, **k: calls.append((a, k)))
    embedded.build_embedded_dataset("reacher/medium-v0")
    embedded.build_embedded_dataset("reacher/medium-v0", episodes=7, seed=2, overwrite=True)
    assert calls == [
        (("reacher/medium-v0",), {"overwrite": False, "seed": 0}),
        (("reacher/medium-v0",), {"overwrite": True, "seed": 2, "episodes": 7}),
    ]


def test_unknown_id_names_every_embedded_id(minari_dir):
    with pytest.raises(ValueError, match="unknown embedded dataset") as error:
        embedded.build_embedded_dataset("reacher/great-v0")
    assert all(dataset_id in str(error.value) for dataset_id in embedded.EMBEDDED_DATASETS)
    with pytest.raises(ValueError, match=r"unknown embedded dataset.*reacher/medium-v0"):
        reacher.build_embedded_dataset("reacher/great-v0")
    with pytest.raises(DatasetError) as error:
        load_minari("reacher/great-v0")
    assert "reacher/medium-v0" in str(error.value) and "pendulum/medium-v0" in str(error.value)


def test_builds_and_loads(minari_dir, cheap_references):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the builder must not leak minari's metadata warnings
        built = reacher.build_embedded_dataset("reacher/medium-v0", episodes=4, seed=3)
    assert (minari_dir / "reacher" / "medium-v0" / "data").is_dir()
    dataset = minari.load_dataset("reacher/medium-v0")
    assert dataset.total_episodes == built.total_episodes == 4
    assert dataset.total_steps == 4 * 50

    metadata = dataset.storage.metadata
    np.testing.assert_allclose(
        [metadata["ref_min_score"], metadata["ref_max_score"]], FAST_REFERENCE
    )
    assert metadata["author"] == {"trajectory-transformer"}
    assert "author_email" not in metadata and "code_permalink" not in metadata
    for words in ("Reacher-v5", "Mean return", "normalised score", "4 episodes of 50 steps"):
        assert words in metadata["description"]
    assert metadata["algorithm_name"]
    assert dataset.spec.env_spec.id == "Reacher-v5"
    assert dataset.spec.env_spec.max_episode_steps == 50
    assert gym.envs.registration.EnvSpec.from_json(metadata["eval_env_spec"]).id == "Reacher-v5"

    assert [episode.id for episode in dataset.iterate_episodes()] == [0, 1, 2, 3]
    for episode in dataset.iterate_episodes():
        assert episode.observations.shape == (51, 10)
        assert episode.actions.shape == (50, 2)
        assert np.abs(episode.actions).max() <= 1.0
        assert episode.rewards.shape == (50,)
        assert not episode.terminations.any()  # Reacher never terminates ...
        assert episode.truncations[-1] and not episode.truncations[:-1].any()  # ... only times out


def test_training_builds_it_on_first_use(minari_dir, cheap_references, monkeypatch):
    """What `tt-train dataset.id=reacher/medium-v0` does when the dataset is missing."""
    small = functools.partial(reacher.build_embedded_dataset, episodes=3)
    monkeypatch.setattr(reacher, "build_embedded_dataset", small)
    episodes, info = load_episodes("reacher/medium-v0")
    assert episodes.num_episodes == 3 and episodes.num_transitions == 150
    assert episodes.truncated.sum() == 3 and not episodes.terminated.any()
    assert (info.observation_dim, info.action_dim) == (10, 2)
    assert info.eval_env_id == "Reacher-v5"
    np.testing.assert_allclose([info.ref_min_score, info.ref_max_score], FAST_REFERENCE)
    np.testing.assert_allclose(info.action_low, [-1.0, -1.0])
    np.testing.assert_allclose(info.action_high, [1.0, 1.0])


def test_fingertip_model_matches_the_environment():
    """The controller's arm (link lengths, observation layout) is gymnasium's: at any pose, its
    forward kinematics minus the target is the observed fingertip-minus-target vector.

    Poses are set directly: after a physics step the observed vector lags the joint angles by
    one 10 ms substep (MuJoCo computes body positions before integrating)."""
    env = gym.make("Reacher-v5").unwrapped
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        qpos = np.concatenate([rng.uniform(-np.pi, np.pi, 1), rng.uniform(-3, 3, 1)])
        qpos = np.concatenate([qpos, rng.uniform(-0.2, 0.2, 2)])  # and a target
        env.set_state(qpos, np.zeros(4))
        obs = env._get_obs()
        tip = reacher.fingertip(np.array([qpos[0]]), np.array([qpos[1]]))[0]
        np.testing.assert_allclose(tip - obs[4:6], obs[8:10], atol=1e-9)
        np.testing.assert_allclose(obs[4:6], qpos[2:], atol=1e-9)


def test_rollout_records_what_gymnasium_does():
    """Each stored episode replays in a plain Reacher-v5: observation, action and reward at every
    index belong together (no off-by-one between the vector env and the buffers)."""
    seeds = np.arange(100, 103)
    result = reacher.rollout(reacher.EpsilonRandomExpert(0.5), seeds, np.random.default_rng(0))
    assert result.observations.shape == (3, 51, 10) and result.actions.shape == (3, 50, 2)
    env = gym.make("Reacher-v5")
    for i, seed in enumerate(seeds):
        obs, _ = env.reset(seed=int(seed))
        observations, rewards = [obs], []
        for action in result.actions[i]:
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            rewards.append(reward)
        assert truncated and not terminated
        np.testing.assert_allclose(result.observations[i], observations, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(result.rewards[i], rewards, rtol=1e-6, atol=1e-6)
    assert not result.terminations.any()
    assert result.truncations[:, -1].all() and not result.truncations[:, :-1].any()


def test_expert_beats_medium_beats_random():
    seeds = np.arange(2000, 2012)
    expert = mean_return(reacher.EpsilonRandomExpert(0.0), seeds)
    medium = mean_return(reacher.EpsilonRandomExpert(reacher.MEDIUM_EPSILON), seeds)
    random = mean_return(reacher.EpsilonRandomExpert(1.0), seeds)
    # Typical values: -3.6, -24 and -43; the margins leave room for any CPU's arithmetic.
    assert expert > -6.0
    assert random < -30.0
    assert expert > medium + 10 and medium > random + 10


def test_expert_holds_the_fingertip_on_the_target():
    env = gym.make("Reacher-v5")
    obs, _ = env.reset(seed=7)
    for _ in range(50):
        obs, *_ = env.step(reacher.expert_action(obs[None])[0])
    assert np.linalg.norm(obs[8:10]) < 0.02  # the target sphere's radius is 0.009
    assert np.abs(obs[6:8]).max() < 0.5


def test_expert_action_bounds():
    rng = np.random.default_rng(0)
    angles = rng.uniform(-3.0, 3.0, (500, 2))
    target = rng.uniform(-0.3, 0.3, (500, 2))
    velocity = rng.uniform(-30, 30, (500, 2))
    tip = reacher.fingertip(angles[:, 0], angles[:, 1])
    obs = np.concatenate([np.cos(angles), np.sin(angles), target, velocity, tip - target], axis=1)
    actions = reacher.expert_action(obs)
    assert actions.shape == (500, 2) and actions.dtype == np.float32
    assert np.isfinite(actions).all() and np.abs(actions).max() <= 1.0


def test_reference_scores_small():
    low, high = reacher.reference_scores(0, episodes=5)
    assert low < -30.0 and high > -6.0
    assert reacher.reference_scores(0, episodes=5) == (low, high)  # cached
