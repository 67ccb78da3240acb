from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
from conftest import create_dataset, make_episode

from trajectory_transformer.data.minari_source import (
    DatasetError,
    episodes_from_minari,
    load_episodes,
    load_minari,
)


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


def test_dict_observations_are_refused():
    rng = np.random.default_rng(0)
    buffer = make_episode(rng, 5, 2, 1, terminated=False, seed=0)
    buffer = replace(buffer, observations={"a": buffer.observations, "b": buffer.observations})
    space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,)), "b": gym.spaces.Box(-1, 1, (2,))})
    dataset = create_dataset(
        "test/dict-v0", buffers=[buffer], observation_space=space, env=None, ref_scores=None
    )
    with pytest.raises(DatasetError, match="Dict observation space"):
        episodes_from_minari(dataset)


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
    from trajectory_transformer.data.minari_source import check_spaces

    with pytest.raises(DatasetError, match="Discrete action space"):
        check_spaces("x", gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3))


def test_nan_names_the_episode():
    rng = np.random.default_rng(0)
    buffers = [make_episode(rng, 4, 2, 1, terminated=False, seed=i) for i in range(3)]
    buffers[1].rewards[2] = np.nan
    create_dataset("test/nan-v0", buffers=buffers, obs_dim=2)
    with pytest.raises(DatasetError, match=r"episode 1 .*rewards at step 2"):
        load_episodes("test/nan-v0")
