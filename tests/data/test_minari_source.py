from dataclasses import replace

import gymnasium as gym
import minari
import numpy as np
import pytest
import torch
from conftest import create_dataset, make_episode

from trajectory_transformer.checkpoint import save_atomic
from trajectory_transformer.data.minari_source import (
    DatasetError,
    DatasetInfo,
    check_spaces,
    episodes_from_minari,
    flatten_observations,
    load_episodes,
    load_minari,
    observation_layout,
)
from trajectory_transformer.suites.collect import content_fingerprint


def test_episodes_keep_terminations_and_truncations_apart(tiny_dataset):
    episodes, info = load_episodes("test/tiny-v0")
    assert episodes.num_episodes == 6
    ends = np.cumsum(episodes.lengths) - 1
    assert episodes.terminated[ends].tolist() == [True, False] * 3
    assert episodes.truncated[ends].tolist() == [False, True] * 3
    assert episodes.terminated.sum() == 3 and episodes.truncated.sum() == 3
    assert info.observation_dim == 3 and info.action_dim == 1
    assert info.ref_min_score == -1200.0 and info.ref_max_score == -150.0
    assert info.eval_env_id == "Pendulum-v1"
    # The first stored episode's data is intact.
    first = next(tiny_dataset.iterate_episodes())
    np.testing.assert_allclose(episodes.observations[:12], first.observations[:12])
    np.testing.assert_allclose(episodes.rewards[:12], first.rewards, rtol=1e-6)


def test_unknown_id_names_local_ids_and_the_commands(tiny_dataset):
    with pytest.raises(DatasetError) as error:
        load_minari("nobody/nothing-v0")
    message = str(error.value)
    assert "nobody/nothing-v0" in message and "test/tiny-v0" in message
    assert "tt-collect" in message and "dataset.download=true" in message


def test_download_failure_is_one_plain_message(monkeypatch):
    import minari

    def offline(dataset_id):
        raise ConnectionError("Failed to resolve host\nlong traceback text")

    monkeypatch.setattr(minari, "download_dataset", offline)
    with pytest.raises(DatasetError, match=r"could not download .*Failed to resolve host") as error:
        load_minari("mujoco/hopper/medium-v0", download=True)
    assert "long traceback" not in str(error.value)


def dict_dataset(dataset_id: str, space: gym.spaces.Dict, episodes: int = 3, length: int = 5):
    """Random episodes whose observations are a dict of the space's keys."""
    rng = np.random.default_rng(0)
    buffers = []
    for i in range(episodes):
        buffer = make_episode(rng, length + i, 1, 1, terminated=False, seed=i)
        observations = {
            key: rng.uniform(-1, 1, (length + i + 1, *sub.shape)).astype(np.float32)
            for key, sub in space.spaces.items()
        }
        buffers.append(replace(buffer, observations=observations))
    return create_dataset(
        dataset_id, buffers=buffers, observation_space=space, env=None, ref_scores=None
    )


GOAL_SPACE = gym.spaces.Dict(
    {
        "observation": gym.spaces.Box(-np.inf, np.inf, (4,)),
        "desired_goal": gym.spaces.Box(-np.inf, np.inf, (2,)),
        "achieved_goal": gym.spaces.Box(-np.inf, np.inf, (2,)),
    }
)


def test_dict_observations_are_flattened_as_gymnasium_flattens_them():
    dataset = dict_dataset("test/dict-v0", GOAL_SPACE)
    episodes, info = load_episodes("test/dict-v0")
    # gymnasium's Dict sorts a mapping's keys: that order is the dataset's and the layout's.
    assert info.observation_layout == (
        ("achieved_goal", (2,)),
        ("desired_goal", (2,)),
        ("observation", (4,)),
    )
    assert info.observation_dim == 8 == gym.spaces.flatdim(dataset.observation_space)
    assert episodes.observations.shape == (5 + 6 + 7, 8)
    first = next(dataset.iterate_episodes())
    for t in range(5):
        row = {key: first.observations[key][t] for key in first.observations}
        expected = gym.spaces.flatten(dataset.observation_space, row)
        np.testing.assert_allclose(episodes.observations[t], expected, rtol=1e-6)
    assert episodes.lengths.tolist() == [5, 6, 7] and episodes.truncated.sum() == 3


def test_nested_dict_observations_name_their_keys_by_path():
    space = gym.spaces.Dict(
        {
            "goal": gym.spaces.Dict(
                {"kettle": gym.spaces.Box(-1, 1, (3,)), "light": gym.spaces.Box(-1, 1, ())}
            ),
            "observation": gym.spaces.Box(-1, 1, (2,)),
        }
    )
    rng = np.random.default_rng(0)
    observations = {
        "goal": {"kettle": rng.uniform(size=(4, 3)), "light": rng.uniform(size=4)},
        "observation": rng.uniform(size=(4, 2)),
    }
    assert observation_layout(space) == (
        ("goal/kettle", (3,)),
        ("goal/light", ()),
        ("observation", (2,)),
    )
    flat = flatten_observations(space, observations, 4)
    for t in range(4):
        row = {
            "goal": {
                "kettle": observations["goal"]["kettle"][t],
                "light": observations["goal"]["light"][t],
            },
            "observation": observations["observation"][t],
        }
        np.testing.assert_allclose(flat[t], gym.spaces.flatten(space, row), rtol=1e-6)


def test_the_layout_survives_a_checkpoint_and_old_checkpoints_read_as_flat(tmp_path):
    info = DatasetInfo(
        "test/dict-v0",
        None,
        "PointMaze_UMaze-v3",
        8,
        2,
        [-1.0] * 2,
        [1.0] * 2,
        None,
        None,
        3,
        18,
        (("achieved_goal", (2,)), ("desired_goal", (2,)), ("observation", (4,))),
    )
    path = save_atomic({"dataset": info.to_dict()}, tmp_path / "info.pt")
    stored = torch.load(path, weights_only=True)["dataset"]
    assert DatasetInfo.from_dict(stored) == info
    old = {key: value for key, value in info.to_dict().items() if key != "observation_layout"}
    assert DatasetInfo.from_dict(old).observation_layout is None


@pytest.mark.parametrize(
    ("subspace", "reason"),
    [
        (gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), r"shape \(8, 8, 3\) \(Dict key 'pixels'\)"),
        (gym.spaces.Discrete(4), r"Discrete observation space \(Dict key 'pixels'\)"),
    ],
)
def test_images_and_discrete_values_inside_a_dict_are_refused(subspace, reason):
    space = gym.spaces.Dict({"observation": gym.spaces.Box(-1, 1, (2,)), "pixels": subspace})
    with pytest.raises(DatasetError, match=reason):
        check_spaces("test/x-v0", space, gym.spaces.Box(-1, 1, (1,)))


def test_image_observations_are_refused():
    rng = np.random.default_rng(0)
    buffer = make_episode(rng, 3, 1, 1, terminated=False, seed=0)
    buffer = replace(buffer, observations=rng.integers(0, 255, (4, 8, 8, 3), dtype=np.uint8))
    space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    dataset = create_dataset(
        "test/image-v0", buffers=[buffer], observation_space=space, env=None, ref_scores=None
    )
    with pytest.raises(DatasetError, match=r"shape \(8, 8, 3\)"):
        episodes_from_minari(dataset)


def test_discrete_actions_are_refused():
    with pytest.raises(DatasetError, match="Discrete action space"):
        check_spaces("x", gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3))


def test_nan_names_the_episode():
    rng = np.random.default_rng(0)
    buffers = [make_episode(rng, 4, 2, 1, terminated=False, seed=i) for i in range(3)]
    buffers[1].rewards[2] = np.nan
    create_dataset("test/nan-v0", buffers=buffers, obs_dim=2)
    with pytest.raises(DatasetError, match=r"episode 1 .*rewards at step 2"):
        load_episodes("test/nan-v0")


def test_a_dataset_without_a_stored_fingerprint_gets_one_from_its_numbers():
    _, first = load_episodes(create_dataset("test/print-a-v0", seed=0).spec.dataset_id)
    _, same = load_episodes(create_dataset("test/print-b-v0", seed=0).spec.dataset_id)
    _, other = load_episodes(create_dataset("test/print-c-v0", seed=1).spec.dataset_id)
    assert first.fingerprint.startswith("sha256:") and len(first.fingerprint) == 7 + 16
    assert same.fingerprint == first.fingerprint != other.fingerprint
    # Computed in the pass that loads the episodes, as a build computes it afterwards.
    built = minari.load_dataset("test/print-a-v0").iterate_episodes()
    assert first.fingerprint == content_fingerprint(built)
    assert DatasetInfo.from_dict(first.to_dict()) == first
