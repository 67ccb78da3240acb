"""What every embedded suite does alike, checked on each: the ids, a tiny build that is a Minari
dataset with reference scores, episodes that replay in a plain env, determinism given a seed,
seeds disjoint between kinds, medium-expert = medium + expert, overwrite; and the registry."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import time
import warnings

import gymnasium as gym
import minari
import numpy as np
import pytest
import torch

from trajectory_transformer import suites
from trajectory_transformer.data.minari_source import DatasetError, load_episodes, load_minari
from trajectory_transformer.scores import normalized_score
from trajectory_transformer.suites import (
    collect,
    double_pendulum,
    inverted_pendulum,
    pendulum,
    pointmaze,
    reacher,
)
from trajectory_transformer.suites.actors import GaussianActor
from trajectory_transformer.suites.collect import content_fingerprint
from trajectory_transformer.suites.locomotion import HOPPER as hopper
from trajectory_transformer.suites.locomotion import WALKER2D as walker2d

REFERENCE_EPISODES = 2  # cheap reference scores for the builds


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a suite's datasets look like."""

    suite: collect.Suite
    ids: set[str]
    sample: str  # a one-kind dataset for the single-dataset checks
    observation: tuple[int, type]  # dimension and dtype
    action: tuple[int, float]  # dimension and bound of the box
    time_limit: int
    never_terminates: bool
    words: tuple[str, ...]  # in the description of the sample built with 4 episodes
    atol: float  # of an observation replayed in a plain env
    reference_bounds: tuple[float, float] | None  # random below the first, expert above the second


SPECS = {
    "pendulum": Spec(
        pendulum.SUITE,
        {f"pendulum/{q}-v0" for q in ("random", "medium", "expert", "medium-replay")}
        | {"pendulum/medium-expert-v0"},
        "pendulum/medium-replay-v0",
        (3, np.float32),
        (1, 2.0),
        200,
        True,
        ("Mean return", "normalised score", "4 episodes of 200 steps", "seed 3"),
        1e-5,  # float32 observations
        (-700.0, -300.0),
    ),
    "reacher": Spec(
        reacher.SUITE,
        {"reacher/medium-v0"},
        "reacher/medium-v0",
        (10, np.float64),
        (2, 1.0),
        50,
        True,
        ("Reacher-v5", "Mean return", "normalised score", "4 episodes of 50 steps", "seed 3"),
        1e-6,
        (-30.0, -6.0),
    ),
    "hopper": Spec(
        hopper.suite,
        {f"hopper/{q}-v0" for q in ("medium", "medium-replay", "expert", "medium-expert")},
        "hopper/medium-v0",
        (11, np.float64),
        (3, 1.0),
        1000,
        False,
        ("SAC", "noise", "4 episodes", "mean return", "normalised score", "base seed 3"),
        1e-8,
        None,  # untrained actors here: no ranking
    ),
    "walker2d": Spec(
        walker2d.suite,
        {f"walker2d/{q}-v0" for q in ("medium", "medium-replay", "expert", "medium-expert")},
        "walker2d/medium-v0",
        (17, np.float64),
        (6, 1.0),
        1000,
        False,
        ("SAC", "noise", "4 episodes", "mean return", "normalised score", "base seed 3"),
        1e-8,
        None,  # untrained actors here: no ranking
    ),
    "double_pendulum": Spec(
        double_pendulum.SUITE,
        {"inverteddoublependulum/medium-v0"},
        "inverteddoublependulum/medium-v0",
        (9, np.float64),
        (1, 1.0),
        1000,
        False,
        ("InvertedDoublePendulum-v5", "4 episodes", "mean return", "normalised score", "seed 3"),
        1e-8,
        (200.0, 9000.0),  # typical: 41 and 9,360
    ),
    "inverted_pendulum": Spec(
        inverted_pendulum.SUITE,
        {"invertedpendulum/medium-v0"},
        "invertedpendulum/medium-v0",
        (4, np.float64),
        (1, 3.0),
        1000,
        False,
        ("InvertedPendulum-v5", "4 episodes", "mean return", "normalised score", "seed 3"),
        1e-8,
        (20.0, 999.0),  # typical: 5 and 1,000
    ),
}


LOCOMOTION = {"hopper": hopper, "walker2d": walker2d}


@pytest.fixture
def untrained_actors(tmp_path, monkeypatch):
    """Seeded, untrained actors in place of the shipped ones of every locomotion task: the
    builders' mechanics, fast (untrained actors fall within a few dozen steps)."""
    for name, task in LOCOMOTION.items():
        folder = tmp_path / name
        folder.mkdir()
        for i, actor_name in enumerate(["expert", "medium", "replay_0", "replay_1"]):
            torch.manual_seed(i)
            actor = GaussianActor(SPECS[name].observation[0], task.action_dim, hidden=16)
            actor.save(folder / f"{actor_name}.pt", step=i, mean_return=i)
        monkeypatch.setattr(task, "policy_dir", folder)
        task.clear_caches()
    yield
    for task in LOCOMOTION.values():
        task.clear_caches()


@pytest.fixture(params=list(SPECS))
def spec(request) -> Spec:
    """Each suite (Hopper and Walker2d with untrained actors)."""
    if request.param in LOCOMOTION:
        request.getfixturevalue("untrained_actors")
    return SPECS[request.param]


def build(spec: Spec, dataset_id: str, **kwargs) -> minari.MinariDataset:
    kwargs = {"episodes": 2, "reference_episodes": REFERENCE_EPISODES} | kwargs
    return spec.suite.build(dataset_id, **kwargs)


def reset_seeds(dataset: minari.MinariDataset) -> list[int]:
    metadata = dataset.storage.get_episode_metadata(range(dataset.total_episodes))
    return [int(m["seed"]) for m in metadata]


def assert_same_episodes(got: list, want: list) -> None:
    """Equal up to float tolerance: the same code on the same machine, never bit-compared."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.observations, b.observations, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(a.actions, b.actions, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(a.rewards, b.rewards, rtol=1e-6, atol=1e-8)
        np.testing.assert_array_equal(a.terminations, b.terminations)
        np.testing.assert_array_equal(a.truncations, b.truncations)


# ----------------------------------------------------------------------------- each suite


def test_ids(spec):
    suite = spec.suite
    assert set(suite.datasets) == spec.ids
    assert all(suites.is_embedded(d) and suites.suite_of(d) is suite for d in spec.ids)
    env = spec.sample.split("/")[0]
    for lookalike in (f"{env}/medium-v1", f"mujoco/{env}/medium-v0", "D4RL/door/human-v2"):
        assert lookalike not in suite.datasets and not suites.is_embedded(lookalike)


def test_unknown_id_names_the_suites_ids(spec):
    with pytest.raises(ValueError, match="unknown embedded dataset") as error:
        spec.suite.build(spec.sample.replace("-v0", "-great-v0"))
    assert all(dataset_id in str(error.value) for dataset_id in spec.ids)


def test_a_tiny_build_is_a_minari_dataset_with_reference_scores(spec, minari_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the builder must not leak minari's metadata warnings
        built = build(spec, spec.sample, episodes=4, seed=3)
    assert (minari_dir / spec.sample / "data").is_dir()
    dataset = minari.load_dataset(spec.sample)
    assert dataset.total_episodes == built.total_episodes == 4
    episodes = list(dataset.iterate_episodes())
    assert dataset.total_steps == sum(len(e.rewards) for e in episodes)

    metadata = dataset.storage.metadata
    # A digest of its numbers names the exact build in every result trained on it.
    assert metadata["content_fingerprint"] == content_fingerprint(episodes)
    assert metadata["content_fingerprint"].startswith("sha256:")
    np.testing.assert_allclose(
        [metadata["ref_min_score"], metadata["ref_max_score"]],
        spec.suite.reference_scores(3, REFERENCE_EPISODES),
    )
    assert metadata["num_episodes_average_score"] == REFERENCE_EPISODES
    assert metadata["author"] == {"trajectory-transformer"}
    assert "author_email" not in metadata and "code_permalink" not in metadata
    assert metadata["description"].startswith(spec.suite.datasets[spec.sample].summary)
    for words in spec.words:
        assert words in metadata["description"]
    assert metadata["algorithm_name"] == spec.suite.datasets[spec.sample].algorithm_name
    assert dataset.spec.env_spec.id == spec.suite.env_id
    assert dataset.spec.env_spec.max_episode_steps == spec.time_limit
    eval_env = gym.envs.registration.EnvSpec.from_json(metadata["eval_env_spec"])
    assert eval_env.id == spec.suite.env_id

    assert [episode.id for episode in episodes] == [0, 1, 2, 3]
    assert len(set(reset_seeds(dataset))) == 4
    (obs_dim, obs_dtype), (act_dim, bound) = spec.observation, spec.action
    for episode in episodes:
        steps = len(episode.rewards)
        assert episode.observations.shape == (steps + 1, obs_dim)
        assert episode.observations.dtype == obs_dtype
        assert episode.actions.shape == (steps, act_dim)
        assert np.abs(episode.actions).max() <= bound
        # One end, at the last step, a termination or a truncation, never both.
        ends = episode.terminations | episode.truncations
        assert ends[-1] and not ends[:-1].any()
        assert not (episode.terminations & episode.truncations).any()
        if spec.never_terminates:  # runs to the time limit
            assert steps == spec.time_limit and not episode.terminations.any()
        elif steps < spec.time_limit:
            assert episode.terminations[-1]  # shorter than the limit: it fell


def test_each_episode_replays_in_a_plain_env(spec):
    """Each stored episode, replayed from its reset seed in a fresh env, is what gymnasium
    returns: observation, action, reward and ends at every index belong together (no
    off-by-one between the vector env and the buffers)."""
    dataset = build(spec, spec.sample, episodes=3)
    for seed, episode in zip(reset_seeds(dataset), dataset.iterate_episodes(), strict=True):
        env = gym.make(spec.suite.env_id)
        obs, _ = env.reset(seed=seed)
        steps = [env.step(action) for action in episode.actions]
        env.close()
        observations = np.array([obs] + [step[0] for step in steps])
        np.testing.assert_allclose(episode.observations, observations, rtol=1e-5, atol=spec.atol)
        np.testing.assert_allclose(episode.rewards, [s[1] for s in steps], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(episode.terminations, [step[2] for step in steps])
        np.testing.assert_array_equal(episode.truncations, [step[3] for step in steps])


def test_deterministic_given_a_seed(spec, tmp_path, monkeypatch):
    def build_in(folder: str, seed: int) -> list:
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / folder))
        pendulum.episodes_of.cache_clear()  # really simulate again
        return list(build(spec, spec.sample, episodes=4, seed=seed).iterate_episodes())

    first, again, other = build_in("a", 0), build_in("b", 0), build_in("c", 1)
    assert_same_episodes(again, first)
    assert content_fingerprint(again) == content_fingerprint(first)
    assert content_fingerprint(other) != content_fingerprint(first)
    assert not np.allclose(first[0].observations[0], other[0].observations[0])


def test_every_dataset_builds_with_seeds_disjoint_between_kinds(spec):
    sizes, seeds = {}, {}
    for dataset_id in spec.ids:
        dataset = build(spec, dataset_id, episodes=3)
        sizes[dataset_id] = dataset.total_episodes
        seeds[dataset_id] = reset_seeds(dataset)
        assert len(set(seeds[dataset_id])) == len(seeds[dataset_id])
    stages = {  # 3 episodes per snapshot
        f"{task.task}/medium-replay-v0": len(task.replay_actors()) for task in LOCOMOTION.values()
    }
    for dataset_id, size in sizes.items():
        kinds = spec.suite.datasets[dataset_id].kinds
        assert size == 3 * len(kinds) * stages.get(dataset_id, 1), dataset_id
    singles = [set(s) for d, s in seeds.items() if len(spec.suite.datasets[d].kinds) == 1]
    assert len(set.union(*singles)) == sum(len(s) for s in singles)  # disjoint across kinds


@pytest.mark.parametrize("spec", ["pendulum", *LOCOMOTION], indirect=True)  # Reacher has none
def test_medium_expert_is_the_medium_then_the_expert_episodes(spec):
    mixed_id = spec.sample.split("/")[0] + "/medium-expert-v0"
    medium, expert, mixed = (
        list(build(spec, mixed_id.replace("medium-expert", kind)).iterate_episodes())
        for kind in ("medium", "expert", "medium-expert")
    )
    assert len(mixed) == 4
    assert_same_episodes(mixed, medium + expert)


def test_an_existing_dataset_is_loaded_unless_overwrite(spec):
    assert build(spec, spec.sample, episodes=2).total_episodes == 2
    assert build(spec, spec.sample, episodes=3).total_episodes == 2  # kept as it is
    assert build(spec, spec.sample, episodes=3, overwrite=True).total_episodes == 3
    assert minari.load_dataset(spec.sample).total_episodes == 3


def test_a_failed_build_leaves_nothing(spec, minari_dir, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(minari, "create_dataset_from_buffers", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        build(spec, spec.sample)
    assert not (minari_dir / spec.sample).exists()


def test_reference_scores_are_cached_and_span_the_policies(spec):
    low, high = spec.suite.reference_scores(0, episodes=5)
    assert spec.suite.reference_scores(0, episodes=5) == (low, high)  # cached
    assert low < high
    if spec.reference_bounds is not None:
        assert low < spec.reference_bounds[0] and high > spec.reference_bounds[1]
    np.testing.assert_allclose(normalized_score(np.array([low, high]), low, high), [0.0, 100.0])


def test_training_builds_it_on_first_use(spec, monkeypatch):
    """What `tt-train dataset.id=<embedded id>` does when the dataset is missing."""
    small = dataclasses.replace(spec.suite, default_episodes=3, reference_episodes=2)
    monkeypatch.setattr(
        suites, "SUITES", tuple(small if s is spec.suite else s for s in suites.SUITES)
    )
    episodes, info = load_episodes(spec.sample)
    assert episodes.num_episodes == 3
    assert (episodes.terminated | episodes.truncated).sum() == 3
    if spec.never_terminates:
        assert episodes.num_transitions == 3 * spec.time_limit
        assert episodes.truncated.sum() == 3 and not episodes.terminated.any()
    assert (info.observation_dim, info.action_dim) == (spec.observation[0], spec.action[0])
    assert info.eval_env_id == spec.suite.env_id
    reference = spec.suite.reference_scores(0, 2)
    np.testing.assert_allclose([info.ref_min_score, info.ref_max_score], reference)
    np.testing.assert_allclose(info.action_low, [-spec.action[1]] * spec.action[0])
    np.testing.assert_allclose(info.action_high, [spec.action[1]] * spec.action[0])


# ----------------------------------------------------------------------------- the registry


def test_the_registry_holds_every_suite():
    assert suites.SUITES[:6] == (
        pendulum.SUITE,
        reacher.SUITE,
        hopper.suite,
        walker2d.suite,
        double_pendulum.SUITE,
        inverted_pendulum.SUITE,
    )
    assert suites.SUITES[6:] == pointmaze.SUITES
    mazes = {f"pointmaze/{maze}-v0" for maze in pointmaze.MAZES}  # tests/suites/test_pointmaze.py
    assert set(suites.EMBEDDED_DATASETS) == set().union(mazes, *(s.ids for s in SPECS.values()))
    assert suites.EMBEDDED_DATASETS["reacher/medium-v0"].startswith("Reacher-v5")


def test_the_registry_builds_every_suite(monkeypatch, untrained_actors):
    monkeypatch.setattr(
        suites,
        "SUITES",
        tuple(dataclasses.replace(s, reference_episodes=2) for s in suites.SUITES),
    )
    built = {
        dataset_id: suites.build_embedded_dataset(dataset_id, episodes=2)
        for dataset_id in (
            "pendulum/expert-v0",
            "reacher/medium-v0",
            "hopper/expert-v0",
            "walker2d/expert-v0",
        )
    }
    assert built["pendulum/expert-v0"].spec.env_spec.id == "Pendulum-v1"
    assert built["pendulum/expert-v0"].total_steps == 2 * 200
    assert built["reacher/medium-v0"].spec.env_spec.id == "Reacher-v5"
    assert built["reacher/medium-v0"].total_steps == 2 * 50
    assert built["hopper/expert-v0"].spec.env_spec.id == "Hopper-v5"
    assert built["hopper/expert-v0"].total_episodes == 2
    assert built["walker2d/expert-v0"].spec.env_spec.id == "Walker2d-v5"
    assert built["walker2d/expert-v0"].total_episodes == 2
    assert set(built) <= set(minari.list_local_datasets())


def test_the_registry_passes_the_settings_and_keeps_each_suites_default(monkeypatch):
    calls = []

    class Recording:
        datasets = frozenset({"reacher/medium-v0"})

        def build(self, *args, **kwargs):
            calls.append((args, kwargs))

    monkeypatch.setattr(suites, "SUITES", (Recording(),))
    suites.build_embedded_dataset("reacher/medium-v0")
    suites.build_embedded_dataset("reacher/medium-v0", episodes=7, seed=2, overwrite=True)
    assert calls == [
        (("reacher/medium-v0",), {"overwrite": False, "episodes": None, "seed": 0}),
        (("reacher/medium-v0",), {"overwrite": True, "episodes": 7, "seed": 2}),
    ]
    assert [s.default_episodes for s in (pendulum.SUITE, reacher.SUITE)] == [500, 500]
    assert hopper.suite.default_episodes is None  # a transition budget per kind
    assert walker2d.suite.default_episodes is None


def test_an_unknown_id_names_every_embedded_id():
    with pytest.raises(ValueError, match="unknown embedded dataset") as error:
        suites.build_embedded_dataset("reacher/great-v0")
    assert all(dataset_id in str(error.value) for dataset_id in suites.EMBEDDED_DATASETS)
    with pytest.raises(DatasetError) as error:
        load_minari("reacher/great-v0")
    assert "reacher/medium-v0" in str(error.value) and "pendulum/medium-v0" in str(error.value)


# ----------------------------------------------------------------------------- the rollout


def test_episodes_that_do_not_run_to_the_time_limit_are_refused(monkeypatch):
    longer = dataclasses.replace(gym.spec("Pendulum-v1"), max_episode_steps=250)
    monkeypatch.setattr(collect.gym, "spec", lambda env_id: longer)
    policy = pendulum.epsilon_random_expert(0.0)
    with pytest.raises(RuntimeError, match="expected to run 250 steps"):
        collect.rollout(
            "Pendulum-v1", policy, np.arange(2), np.random.default_rng(0), fixed_length=True
        )


def zero_torques(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Deterministic, and a hopper falls at seed-dependent steps."""
    return np.zeros((len(obs), 3))


def test_an_env_that_ends_starts_the_next_seed_and_each_episode_is_its_own():
    rng = np.random.default_rng(0)
    together = collect.rollout("Hopper-v5", zero_torques, range(7), rng, num_envs=3)
    assert together.seeds == tuple(range(7))
    assert len({len(r) for r in together.rewards}) > 1  # the envs restarted at different steps
    for i, seed in enumerate(together.seeds):
        alone = collect.rollout("Hopper-v5", zero_torques, [seed], rng, num_envs=1)
        np.testing.assert_allclose(
            together.observations[i], alone.observations[0], rtol=1e-6, atol=1e-8
        )
        np.testing.assert_array_equal(together.terminations[i], alone.terminations[0])
        np.testing.assert_array_equal(together.truncations[i], alone.truncations[0])


def test_a_transition_budget_keeps_the_shortest_prefix_of_seeds_that_reaches_it():
    rng = np.random.default_rng(0)
    policy, seeds = hopper.uniform_random, itertools.count(10)
    run = collect.rollout("Hopper-v5", policy, seeds, rng, num_envs=25, transitions=150)
    lengths = [len(r) for r in run.rewards]
    assert run.seeds == tuple(range(10, 10 + len(lengths)))
    assert sum(lengths) >= 150 > sum(lengths[:-1])
    with pytest.raises(ValueError, match="num_envs"):  # endless seeds, one env each
        collect.play("Hopper-v5", hopper.uniform_random, seed=0, kind=5, transitions=150)


def test_rollouts_are_read_only_and_concatenate_in_order():
    rng = np.random.default_rng(0)
    policy = pendulum.epsilon_random_expert(1.0)
    first = collect.rollout("Pendulum-v1", policy, [1, 2], rng, max_episode_steps=5)
    second = collect.rollout("Pendulum-v1", policy, [3], rng, max_episode_steps=5)
    both = collect.Rollout.concatenate([first, second])
    assert both.seeds == (1, 2, 3) and len(both) == 3 and both.transitions == 15
    np.testing.assert_array_equal(both.returns, [*first.returns, *second.returns])
    with pytest.raises(ValueError, match="read-only"):
        both.rewards[0][0] = 0.0
    assert [b.id for b in both.buffers()] == [0, 1, 2]


def test_seed_blocks_refuse_what_would_overlap():
    with pytest.raises(ValueError, match="seed must be non-negative"):
        collect.play("Pendulum-v1", zero_torques, seed=-1, kind=0, episodes=1)
    with pytest.raises(ValueError, match="episodes must be in"):
        collect.play("Pendulum-v1", zero_torques, seed=0, kind=0, episodes=collect.KIND_BLOCK + 1)


def test_two_processes_building_one_id_at_once_both_get_the_same_complete_dataset(tmp_path):
    """One builds while the other waits on the build lock, then loads what it wrote; neither
    deletes the other's work."""
    builder = (
        "import sys, time\n"
        "from trajectory_transformer.suites import pendulum\n"
        "while time.time() < float(sys.argv[1]):\n"  # start together
        "    time.sleep(0.001)\n"
        "dataset = pendulum.SUITE.build('pendulum/medium-v0', episodes=6, reference_episodes=2)\n"
        "print(dataset.total_episodes, dataset.total_steps)\n"
    )
    start = time.time() + 3.0
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", builder, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
        assert out.split() == ["6", "1200"]
    dataset = minari.load_dataset("pendulum/medium-v0")
    assert dataset.total_episodes == 6
    rewards = [episode.rewards for episode in dataset.iterate_episodes()]
    assert len(rewards) == 6 and all(len(r) == 200 for r in rewards)
